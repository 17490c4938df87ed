"""Builders of argv lists (pure). Execution lives in `b70deploy.proc`."""
