"""The Docker side (see the module map in b70deploy/__init__.py).

`import docker` (the SDK) imports paramiko, for its ssh:// transport, whatever the endpoint:
about 70 ms of imports (invoke, asyncio, cryptography), a third of what `status` needs on a
local engine. Every module here is imported through this package, so paramiko is first
registered as a stand-in module that imports the real one on first attribute use (the SDK
touches `paramiko.SSHClient` only when an ssh:// client connects). The stdlib's LazyLoader
cannot do this: the import system reads `__spec__` of a module already in sys.modules,
which makes a LazyLoader module load at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


class _OnFirstUse(types.ModuleType):
    def __getattr__(self, name: str) -> Any:  # only for names the stand-in does not have yet
        del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)  # modules that imported the stand-in see the real names
        return getattr(real, name)


def _import_on_first_use(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        return  # not installed: the SDK's own ImportError handling applies, as before
    stand_in = _OnFirstUse(name)
    stand_in.__spec__ = spec
    stand_in.__path__ = list(spec.submodule_search_locations or [])
    sys.modules[name] = stand_in


_import_on_first_use("paramiko")
