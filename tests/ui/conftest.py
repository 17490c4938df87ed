"""The switch's notifications use watch's node on the real engine (tests/watch/conftest.py)."""

from watch.conftest import watched

__all__ = ["watched"]
