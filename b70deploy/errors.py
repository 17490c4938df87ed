"""The ways a command fails, and their exit codes.

UserError is a mistake in input (a stack file, the node config, an argument): exit 2,
one line, and nothing has been changed. OperationError is the node misbehaving (an
engine error, a stack that never became healthy): exit 1. Both read
"where: what; fix: how", and the CLI prints that one line (cli/__init__.py `main`).

The exception tree, complete (tests/test_errors.py checks it): where each class lives; the
ones not under B70Error never reach the CLI, their catcher turns them into a result or into a
B70Error:

    Exception
    +-- B70Error                   errors.py: exit_code 1; `where=`, `fix=`
    |   +-- UserError              errors.py: bad input, exit 2, newlines escaped
    |   |   +-- DamagedRecord      state/revisions.py: a record that cannot be read, or stored bytes
    |   |                          that are not the ones recorded (fsck --repair mends)
    |   +-- OperationError         errors.py: the node failed, exit 1
    |       +-- Declined           errors.py: the operator answered no at the prompt; nothing changed
    |       +-- LockBusy           state/lock.py: another command holds the node
    |       +-- StaleLock          state/lock.py: the holder died mid-run (resume/rollback/unlock)
    |       +-- StateDirFull       state/space.py: too little room for a run, refused before the drain
    |       +-- NodeBusy           errors.py: the host's load over its bound, refused before the drain
    +-- StepFailed                 deploy/runner.py: a step raised; carries the cause and the
    |                              undo errors; deploy/driver.py turns it into the Outcome
    +-- BootFailed                 docker/health.py: inside wait_healthy only (fatal line, exit,
    |                              stall); returned as WaitResult(healthy=False, finding)
    +-- DeliveryFailed             ui/notify.py: one attempt to reach a receiver failed; retried,
    |                              then an audit line (notifications are fail-open)
    +-- EditError                  render/patches.py: an edit no longer applies; becomes a UserError
    +-- ValueError
    |   +-- _LongNumber            config/schema.py: an inline JSON number too long; pydantic's error
    +-- yaml.YAMLError
    |   +-- _Refused               config/yamlfile.py: what the bounded loader refuses; becomes a UserError
    +-- InvalidServeArgs           sim/server.py: flags vLLM's validation refuses (the simulator's)
    +-- ApiError                   sim/server.py: the simulator's HTTP error reply (not the package's)
    BaseException
    +-- KeyboardInterrupt          Ctrl-C: the running step and the steps done are undone, exit 130
    |   +-- Terminated             errors.py: SIGTERM, handled as Ctrl-C is (deploy/interrupts.py), exit 143
    +-- Killed                     deploy/runner.py: SIGKILL in tests that drive the runner in-process
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class B70Error(Exception):
    """A failure the CLI reports as one line and an exit code: "where: what; fix: how"."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, where: str = "", fix: str = "") -> None:
        self.where = where
        self.what = self._text(f"{where}: {message}" if where else message)  # the line without its fix
        self.fix = fix
        super().__init__(f"{self.what}; fix: {self._text(fix)}" if fix else self.what)

    def _text(self, text: str) -> str:
        return text


class UserError(B70Error):
    """Bad input. The message is one line: where (file, key), what, and the fix."""

    exit_code = EXIT_BAD_INPUT

    def _text(self, text: str) -> str:
        # One line, whatever the input held (a key or file name with a newline in it).
        return text.replace("\r", "\\r").replace("\n", "\\n")


class OperationError(B70Error):
    """The node did not do what was asked; the command failed (exit 1). A caller may append
    the container's last log lines after a newline (the dark boot does): they are kept."""

    exit_code = EXIT_FAILED


class NodeBusy(OperationError):
    """The host is busy (its load over the node config's load_threshold): the switch is refused before
    the drain, the clients still served and nothing changed (deploy/steps.py `idle`)."""


class Declined(OperationError):
    """The operator said no to "Drain production ...?": nothing changed; audited as declined."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: an interrupt like Ctrl-C, so the running step is finished or undone, never cut."""
