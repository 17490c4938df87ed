"""A compose service's container as `docker inspect` shows it, and its state.

engine.py asks the SDK; `status` asks the docker CLI here instead (`docker ps`, then
`docker container inspect`, about 15 ms each on a local engine), because importing the SDK
(requests, and paramiko for ssh://) would cost it about 0.4 s of its 0.3 s budget (issue 13).
Both target the same engine: proc.run passes the endpoint of endpoint.py to the CLI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import OperationError
from .proc import last_line, run

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


@dataclass
class ContainerState:
    status: str          # created, running, restarting, exited, dead, missing
    exit_code: int | None
    restart_count: int
    started_at: str
    image_id: str | None



def state_from(attrs: dict[str, Any] | None) -> ContainerState:
    """The state in a container's inspect document (None: no container)."""
    if attrs is None:
        return ContainerState("missing", None, 0, "", None)
    st = attrs.get("State", {})
    return ContainerState(status=st.get("Status", "?"), exit_code=st.get("ExitCode"),
                          restart_count=int(attrs.get("RestartCount", 0)),
                          started_at=st.get("StartedAt", ""), image_id=attrs.get("Image"))


def inspect_service(project: str, service: str) -> dict[str, Any] | None:
    """The inspect document of the project's container for `service` (the newest, as the SDK's
    list gives it first), None when there is none; an OperationError when the engine does not
    answer."""
    ids = run(["docker", "ps", "--all", "--quiet", "--no-trunc", "--filter", f"label={PROJECT_LABEL}={project}",
               "--filter", f"label={SERVICE_LABEL}={service}"], timeout=60).stdout.split()
    if not ids:
        return None
    result = run(["docker", "container", "inspect", ids[0]], timeout=60, check=False)
    if result.returncode != 0:
        if "No such" in result.stderr:  # removed since `docker ps`: gone
            return None
        raise OperationError(f"docker container inspect failed (exit {result.returncode}): "
                             f"{last_line(result.stderr)}", fix="check the engine answers (docker info)")
    found = json.loads(result.stdout)
    return dict(found[0]) if found else None


def standby_slots(project: str, service: str) -> list[dict[str, Any]]:
    """The node's hot-standby slots (docker/standby.py: compose projects `<project>-r<N>`), each as
    {slot, id, status, on_door, port, stack, asleep}, through the docker CLI (fast, no SDK). `asleep` is
    the slot's own GET /is_sleeping (vllm/entrypoints/serve/sleep/api_router.py), None when it does not say."""
    import re
    import urllib.request

    rows = run(["docker", "ps", "--all", "--no-trunc", "--filter", "label=b70deploy.role=vllm", "--filter",
                f"label={SERVICE_LABEL}={service}", "--format", '{{.ID}} {{.Label "' + PROJECT_LABEL + '"}}'],
               timeout=60).stdout.splitlines()
    pattern = re.compile(re.escape(project) + r"-r(\d+)")
    mine = {box: int(m.group(1)) for box, _, proj in (r.partition(" ") for r in rows)
            if (m := pattern.fullmatch(proj.strip()))}
    if not mine:
        return []
    result = run(["docker", "container", "inspect", *mine], timeout=60, check=False)
    out = []
    for doc in json.loads(result.stdout or "[]"):
        net = (doc.get("NetworkSettings") or {})
        bound = (net.get("Ports") or {}).get("8000/tcp") or []
        port = next((int(b["HostPort"]) for b in bound if str(b.get("HostPort", "")).isdigit()), None)
        status = str((doc.get("State") or {}).get("Status", "?"))
        asleep: bool | None = None
        if status == "running" and port is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_sleeping", timeout=3) as r:
                    asleep = bool(json.loads(r.read()).get("is_sleeping"))
            except (OSError, ValueError):
                asleep = None
        out.append({"slot": mine.get(doc["Id"]), "id": doc["Id"], "status": status,
                    "on_door": f"{project}_default" in (net.get("Networks") or {}), "port": port,
                    "stack": ((doc.get("Config") or {}).get("Labels") or {}).get("b70deploy.stack"), "asleep": asleep,
                    "doc": doc})
    return sorted(out, key=lambda s: s["slot"] or 0)
