"""The two ways a command fails, and their exit codes.

UserError is a mistake in input (a stack file, the node config, an argument): exit 2,
one line, and nothing has been changed. OperationError is the node misbehaving (an
engine error, a stack that never became healthy): exit 1.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class B70Error(Exception):
    exit_code = EXIT_FAILED


class UserError(B70Error):
    """Bad input. The message is one line: where (file, key), what, and the fix."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, where: str = "", fix: str = "") -> None:
        self.where = where
        self.fix = fix
        parts = [f"{where}: {message}" if where else message]
        if fix:
            parts.append(f"fix: {fix}")
        # One line, whatever the input held (a key or file name with a newline in it).
        super().__init__("; ".join(parts).replace("\r", "\\r").replace("\n", "\\n"))


class OperationError(B70Error):
    """The node did not do what was asked; the command failed (exit 1)."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, fix: str = "") -> None:
        self.fix = fix
        super().__init__(f"{message}; fix: {fix}" if fix else message)
