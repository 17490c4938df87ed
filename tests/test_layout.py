"""The package's layout: each room on its floor, imports only downward, at most 14 rooms, and
the module map in b70deploy/__init__.py naming every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import b70deploy

ROOT = Path(b70deploy.__file__).parent


def _modules() -> dict[str, Path]:
    """Dotted name below b70deploy (a package by its folder) -> its file."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module below b70deploy) of every import in the file, lazy and
    TYPE_CHECKING ones included; relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                targets = [".".join([*base, node.module])] if node.module else \
                    [".".join([*base, a.name]) for a in node.names]
            elif node.module and node.module.startswith("b70deploy."):
                targets = [node.module.removeprefix("b70deploy.")]
            else:
                targets = []
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("b70deploy.") for a in node.names if a.name.startswith("b70deploy.")]
        else:
            continue
        found += [(node.lineno, t) for t in targets if t]
    return found


def _floor(room: str) -> int:
    for n, rooms in enumerate(b70deploy.FLOORS):
        if room in rooms:
            return n
    raise AssertionError(f"room {room} is on no floor of b70deploy.FLOORS")


def test_every_room_is_on_one_floor() -> None:
    rooms = {name.split(".")[0] for name in _modules()}
    listed = [r for floor in b70deploy.FLOORS for r in floor]
    assert sorted(listed) == sorted(rooms), "b70deploy.FLOORS must list each room exactly once"


def test_no_import_runs_back_up_a_floor() -> None:
    """A room imports its own modules and the rooms below it; never its own floor's others or
    one above (deploy/ never reaches docker/: the NodeIO seam points the other way)."""
    wrong = []
    for name, path in _modules().items():
        room = name.split(".")[0]
        for line, target in _imports(name, path):
            other = target.split(".")[0]
            if other != room and _floor(other) >= _floor(room):
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {room} (floor {_floor(room)}) imports "
                             f"{target} (floor {_floor(other)})")
    assert not wrong, "\n".join(wrong)


def test_the_floor_check_sees_a_relative_import_back_up(tmp_path: Path) -> None:
    """The check itself: `from ..docker.engine import x` in deploy/plan.py would be caught."""
    probe = tmp_path / "plan.py"
    probe.write_text("from ..docker.engine import client\nfrom .nodeio import VLLM\n")
    assert _imports("deploy.plan", probe) == [(1, "docker.engine"), (2, "deploy.nodeio")]
    assert _floor("docker") > _floor("deploy")


def test_at_most_fourteen_rooms() -> None:
    entries = sorted(p.name for p in ROOT.iterdir() if p.name not in ("__init__.py", "__pycache__", "py.typed"))
    assert len(entries) <= 14, entries


def test_the_module_map_names_every_module() -> None:
    """Each room and each of its modules appears in the map of b70deploy/__init__.py."""
    doc = b70deploy.__doc__ or ""
    missing = []
    for name in _modules():
        room, _, module = name.partition(".")
        if module.startswith("__"):  # __main__
            continue
        section = re.search(rf"^    {re.escape(room)}(/|\.py)\s(.*?)(?=^    \S|\Z)", doc, re.M | re.S)
        if section is None:
            missing.append(room)
        elif module and not re.search(rf"\({re.escape(module)}\)|\b{re.escape(module)}[,;:)]", section.group(2)):
            missing.append(name)
    assert not missing, f"not in the module map of b70deploy/__init__.py: {missing}"
