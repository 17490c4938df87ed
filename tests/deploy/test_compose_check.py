"""The preflight's model check (deploy/steps.compose_check) reads the model wherever the compose
file starts vLLM: in command:, or in entrypoint: when there is no command (naptha-node's model files)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import pytest

from b70deploy.deploy.nodeio import NodeIO
from b70deploy.deploy.steps import compose_check
from b70deploy.errors import UserError


@dataclass
class Resolved:
    """What compose_check asks of the node: its vLLM service, and `docker compose config` of the files."""

    resolved: dict[str, Any]
    service: str = "Qwen2.5-7B-Instruct"

    def compose_config(self, files: Mapping[str, bytes]) -> tuple[dict[str, Any] | None, str | None]:
        return {"services": {self.service: self.resolved}}, None


def check(service: dict[str, Any]) -> None:
    compose_check(cast(NodeIO, Resolved(service)), {})


def test_the_model_in_the_entrypoint_with_no_command_passes() -> None:
    check({"entrypoint": ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "32768"]})
    check({"entrypoint": ["vllm", "serve"], "command": ["Qwen/Qwen2.5-7B-Instruct"]})


@pytest.mark.parametrize("service", [{"entrypoint": ["vllm", "serve", ""]}, {"command": ["--max-model-len", "8"]},
                                     {"entrypoint": ["vllm", "serve"]}])
def test_an_empty_model_is_still_refused(service: dict[str, Any]) -> None:
    with pytest.raises(UserError, match="model argument is empty"):
        check(service)
