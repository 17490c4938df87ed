"""The error classes: "where: what; fix: how", one line for input errors, and the exit codes."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from b70deploy.errors import EXIT_BAD_INPUT, EXIT_FAILED, B70Error, OperationError, UserError
from b70deploy.state.lock import DeployLock, LockBusy, StaleLock


@pytest.mark.parametrize("cls", [UserError, OperationError])
def test_where_what_fix(cls: type[B70Error]) -> None:
    e = cls("the engine refused", where="node.yaml", fix="start dockerd")
    assert str(e) == "node.yaml: the engine refused; fix: start dockerd"
    assert (e.where, e.what, e.fix) == ("node.yaml", "node.yaml: the engine refused", "start dockerd")
    assert str(cls("plain")) == "plain" and cls("plain").fix == ""
    assert str(cls("what", fix="how")) == "what; fix: how"


def test_exit_codes() -> None:
    assert UserError("x").exit_code == EXIT_BAD_INPUT == 2
    assert OperationError("x").exit_code == EXIT_FAILED == 1
    assert issubclass(LockBusy, OperationError) and issubclass(StaleLock, OperationError)


def test_user_error_is_one_line_but_an_operation_error_keeps_an_appended_log_tail() -> None:
    assert str(UserError("key 'a\nb'", fix="rename\r")) == "key 'a\\nb'; fix: rename\\r"
    # actions/dark.py appends the container's last lines after the one-line summary.
    assert str(OperationError("not healthy", fix="roll back")) == "not healthy; fix: roll back"
    assert str(OperationError("not healthy\n  | last line")).splitlines() == ["not healthy", "  | last line"]


def test_pickles_as_its_text() -> None:
    e = pickle.loads(pickle.dumps(OperationError("what", fix="how")))
    assert isinstance(e, OperationError) and str(e) == "what; fix: how"


def test_lock_busy_says_the_fix(tmp_path: Path) -> None:
    with DeployLock(tmp_path, "switch a"), pytest.raises(LockBusy) as info:
        DeployLock(tmp_path, "switch b").acquire()
    assert info.value.fix == "wait for it, or pass --lock-wait SECONDS"
    assert str(info.value).endswith("; fix: wait for it, or pass --lock-wait SECONDS")


def _exception_classes() -> list[tuple[str, str, type[BaseException]]]:
    """(name, file under b70deploy/, class) of every exception class the package defines."""
    import importlib
    import inspect
    import pkgutil

    import b70deploy

    found = []
    for info in pkgutil.walk_packages(b70deploy.__path__, "b70deploy."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                rel = Path(inspect.getfile(obj)).relative_to(Path(b70deploy.__file__).parent).as_posix()
                found.append((name, rel, obj))
    return found


def test_the_exception_tree_in_errors_py_is_complete() -> None:
    """Each exception class the package defines has its line in the tree, naming its file, under
    its parent class."""
    import b70deploy.errors

    lines = (b70deploy.errors.__doc__ or "").splitlines()
    classes = _exception_classes()
    assert {"DeliveryFailed", "StepFailed", "LockBusy", "BootFailed"} <= {name for name, _, _ in classes}
    for name, rel, cls in classes:
        named = (i for i, line in enumerate(lines) if "+-- " in line and line.split("+-- ")[-1].split(" ")[0] == name)
        row = next(named, None)
        assert row is not None, f"{name} ({rel}) is not in the exception tree of errors.py"
        assert f"{rel}:" in lines[row], (name, rel, lines[row])
        depth = lines[row].index("+-- ")
        parent = next(line for line in reversed(lines[:row]) if ("+-- " in line and line.index("+-- ") < depth)
                      or line.strip() in ("Exception", "BaseException"))
        parent_name = parent.split("+-- ")[-1].strip().split(" ")[0].split(".")[-1]
        assert parent_name == cls.__mro__[1].__name__, (name, parent_name, cls.__mro__[1].__name__)
