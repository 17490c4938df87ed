"""argv lists for `docker compose` against one project directory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..render.files import COMPOSE_FILE

PROFILE = "gpu"


@dataclass(frozen=True)
class Compose:
    project_dir: Path
    project: str
    # The project's compose files in the folder, in -f order, and its profiles, as Compose ran it
    # (node config compose_files and profiles); a rendered deployment is one file and `gpu`.
    files: tuple[str, ...] = (COMPOSE_FILE,)
    profiles: tuple[str, ...] = (PROFILE,)

    def base(self) -> list[str]:
        argv = ["docker", "compose", "--project-directory", str(self.project_dir)]
        for name in self.files:
            argv += ["-f", str(self.project_dir / name)]
        argv += ["-p", self.project]
        for profile in self.profiles:
            argv += ["--profile", profile]
        return argv

    def config(self, *, fmt: str = "yaml") -> list[str]:
        return [*self.base(), "config", "--format", fmt]

    def up(self, services: Sequence[str], *, recreate: bool = True) -> list[str]:
        argv = [*self.base(), "up", "-d", "--no-deps", "--pull", "never"]
        if recreate:
            argv.append("--force-recreate")
        return [*argv, *services]

    def networks_for(self, service: str) -> list[str]:
        """The service's networks created from the files, its container left as it is (not recreated,
        not started; created only if it has none)."""
        return [*self.base(), "up", "--no-start", "--no-recreate", "--no-deps", "--pull", "never", service]

    def create(self, services: Sequence[str], *, stop_timeout: int) -> list[str]:
        """The services' containers replaced by new ones from the files, not started: Compose
        creates each replacement while the old container still runs, then stops it (its stop
        signal, SIGKILL after `stop_timeout`), removes it and gives the new one its name."""
        return [*self.base(), "up", "--no-start", "--no-deps", "--pull", "never", "--force-recreate",
                "--timeout", str(stop_timeout), *services]

    def down(self) -> list[str]:
        return [*self.base(), "down", "--remove-orphans", "--timeout", "10"]

    def logs(self, service: str, *, tail: int | None = None) -> list[str]:
        argv = [*self.base(), "logs", "--no-color", "--no-log-prefix"]
        if tail is not None:
            argv += ["--tail", str(tail)]
        return [*argv, service]


def config_of(compose_file: Path, *, env_file: Path | None = None, more: Sequence[Path] = (),
              profiles: Sequence[str] = ()) -> list[str]:
    """`docker compose config` of an operator's own compose file (and the files `more` Compose
    reads after it: an override file), as Compose reads them: the `profiles` given, else every
    profile on (a vllm service often sits behind one), ${VAR} from `env_file` or else the .env
    beside the file (and the shell), env_file: contents merged into each service's environment."""
    argv = ["docker", "compose", "--project-directory", str(compose_file.parent), "-f", str(compose_file)]
    for path in more:
        argv += ["-f", str(path)]
    for profile in profiles or ["*"]:
        argv += ["--profile", profile]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    return [*argv, "config", "--format", "json"]
