"""The command line: the lazy root group of `base`, and `main`, which turns every error into one
line and an exit code."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any, NoReturn

import click

from ..deploy import interrupts
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, B70Error, Terminated
from ..state.space import FULL_ERRNOS, FULL_FIX
from .base import cli

__all__ = ["cli", "main", "run"]


def run() -> None:
    """The process's entry point (`b70deploy`, `python -m b70deploy.cli`): `main`, with the
    garbage collector held off while the command's modules load, and out of the exit."""
    # The imports make ~50,000 objects and no garbage, yet set off ~140 collections (~50 ms of
    # a switch); the root group turns collecting on once the command is loaded (base.py).
    gc.disable()
    try:
        main()
    finally:
        # At exit the interpreter collects once more, walking every object the imports made
        # (pydantic's schemas, the docker SDK's classes) only to free memory the exit frees
        # anyway: ~0.1 s of every command. Frozen objects are left out. Not in `main`: the
        # tests run that in their own process.
        gc.freeze()


def main(argv: list[str] | None = None) -> None:
    # SIGTERM (systemd, docker stop, kill) interrupts like Ctrl-C: the runner undoes the
    # running step and the ones done, instead of the process ending between two effects.
    with interrupts.installed():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    try:
        rc: Any = cli.main(args=argv, prog_name="b70deploy", standalone_mode=False)
    except B70Error as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # click wraps Ctrl-C and SIGTERM in Abort
            _interrupted(e.__cause__)
        click.echo("aborted", err=True)
        sys.exit(EXIT_FAILED)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_BAD_INPUT if e.exit_code == 2 else e.exit_code)
    except OSError as e:  # a state, deploy or models dir that cannot be made or written
        if os.environ.get("B70DEPLOY_DEBUG"):
            raise
        where = e.filename or "a file"
        if e.errno in FULL_ERRNOS:
            click.echo(f"error: {where}: {e.strerror}: its filesystem is full; fix: {FULL_FIX}", err=True)
            sys.exit(EXIT_FAILED)
        click.echo(f"error: {where}: {e.strerror or e}; fix: check the folders in the node config (state_dir, "
                   "deploy_dir, models_dir) exist or can be made, and that this user may write them "
                   "(B70DEPLOY_DEBUG=1 shows the traceback)", err=True)
        sys.exit(EXIT_BAD_INPUT if isinstance(e, PermissionError | FileNotFoundError | NotADirectoryError)
                 else EXIT_FAILED)
    except KeyboardInterrupt as e:
        _interrupted(e)
    sys.exit(rc if isinstance(rc, int) else 0)


def _interrupted(e: KeyboardInterrupt) -> NoReturn:
    click.echo("terminated" if isinstance(e, Terminated) else "interrupted", err=True)
    sys.exit(143 if isinstance(e, Terminated) else 130)
