"""The KV-budget lint against the report's numbers: the draft's own KV layer counted, measured
memory (a previous boot's facts or saved log) preferred over the node's estimate."""

from __future__ import annotations

import re
from typing import Any

import pytest

from b70deploy.config.node import Node
from b70deploy.config.schema import Stack
from b70deploy.lint import kv, lint_stack
from b70deploy.lint.gather import RevisionMemory, context, measured_kv
from b70deploy.sim.box import EAGLE3_DRAFT, QWEN3_30B
from b70deploy.state.revisions import RevisionStore

# The report's first EAGLE-3 boot at 262,144 (compiled), as vLLM logged it.
REFUSED_LOG = [
    "(EngineCore_DP0 pid=311) INFO 07-05 14:02:11 [gpu_model_runner.py:2653] Model loading took 16.06 GiB memory",
    "(EngineCore_DP0 pid=311) INFO 07-05 14:03:40 [gpu_worker.py:298] Available KV cache memory: 11.74 GiB",
    "(EngineCore_DP0 pid=311) ValueError: To serve at least one request with the models's max seq len (262144), "
    "(12.25 GiB KV cache is needed, which is larger than the available KV cache memory (11.74 GiB). Based on the "
    "available memory, the estimated maximum model length is 251200. Try increasing `gpu_memory_utilization` or "
    "decreasing `max_model_len` when initializing the engine.",
]


def _record(node: Node, stack: Stack, *, facts: dict[str, Any] | None = None, log: list[str] | None = None,
            outcome: str = "deployed") -> int:
    store = RevisionStore(node.state_dir)
    rev = store.create(stack=stack.name, kind="switch", files={"docker-compose.yml": b"x"}, image_ref=stack.image,
                       image_id="sha256:" + "2" * 64, repo_digest=None, operator="t", message="", created="now",
                       stack_doc=stack.model_dump(mode="json"))
    store.update_status(rev.number, outcome=outcome, facts=facts or {})
    if log:
        store.save_log(rev.number, "\n".join(log) + "\n")
    return rev.number


def _kv(node: Node, stack: Stack) -> list[str]:
    return [f.message for f in lint_stack(context(node, stack, docker=False)) if f.id == "kv-budget"]


def _first_boot(node: Node) -> Stack:
    """eagle3 as it first booted: compiled (no --enforce-eager)."""
    return node.catalogue().load("eagle3").model_copy(update={"enforce_eager": False})


def test_the_draft_adds_its_own_kv_layer() -> None:
    assert kv.kv_bytes_per_token(QWEN3_30B, "fp8", "float16") == 48 * 4 * 128 * 2 == 49_152
    assert EAGLE3_DRAFT["num_hidden_layers"] == 1
    assert kv.per_token_with_draft(QWEN3_30B, EAGLE3_DRAFT, "fp8", "float16") == (50_176, 1_024)
    assert kv.gib_needed(262_144, 50_176) == 12.25
    assert kv.fit_tokens(11.74 * kv.GIB, 50_176) == 251_200


def test_the_refused_first_eagle3_boot_is_reproduced_from_its_saved_log(node: Node) -> None:
    stack = _first_boot(node)
    number = _record(node, stack, log=REFUSED_LOG, outcome="failed")
    [msg] = _kv(node, stack)
    need, have, fit = re.search(r"\((\d+\.\d+) GiB KV cache is needed.*memory \((\d+\.\d+) GiB\).*length is (\d+)",
                                REFUSED_LOG[-1]).groups()  # type: ignore[union-attr]
    assert f"needs {need} GiB" in msg and f"the {have} GiB revision {number} measured" in msg
    assert f"about {int(fit):,} tokens fit" in msg and "50,176 bytes per token" in msg
    assert "vLLM refuses to start" in msg


def test_measured_memory_in_the_facts_wins_over_the_node_estimate(node: Node) -> None:
    stack = _first_boot(node)
    _record(node, stack, facts={"available_kv_gib": 11.74})
    [msg] = _kv(node, stack)
    assert "needs 12.25 GiB" in msg and "11.74 GiB" in msg and "about 251,200 tokens fit" in msg
    assert "declared by the node" not in msg


def test_the_shipped_eager_eagle3_with_its_measured_pool_is_clean(node: Node) -> None:
    eager = node.catalogue().load("eagle3")
    assert eager.enforce_eager and eager.max_model_len == 262_144
    _record(node, _first_boot(node), log=REFUSED_LOG, outcome="failed")  # another config: does not count
    _record(node, eager, facts={"kv_cache_tokens": 265_664, "available_kv_gib": 12.41})
    assert _kv(node, eager) == []
    assert lint_stack(context(node, eager, docker=False)) == []


def test_a_measured_pool_too_small_warns(node: Node) -> None:
    eager = node.catalogue().load("eagle3")
    _record(node, eager, facts={"kv_cache_tokens": 251_200})
    [msg] = _kv(node, eager)
    assert "KV pool of 251,200 tokens" in msg and "262,144-token request does not fit" in msg


def test_a_boot_of_another_image_or_draft_is_not_a_measurement(node: Node) -> None:
    stack = _first_boot(node)
    other = stack.model_copy(update={"image": "intel/vllm:older"})
    _record(node, other, facts={"available_kv_gib": 1.0})
    no_draft = node.catalogue().load("w4a16").model_copy(update={"enforce_eager": False})
    _record(node, no_draft, facts={"available_kv_gib": 1.0})
    # Neither applies: the node's estimate decides (12.39 - 0.34 GiB of draft: short by 0.2 GiB).
    [msg] = _kv(node, stack)
    assert "12.39 GiB declared by the node, less 0.34 GiB of draft weights" in msg and "about 257,792" in msg


def test_no_false_alarm_on_the_production_configs(node: Node) -> None:
    # Fresh node, the node's 12.39 GiB only: w4a16 at 262,144 (270,663 tokens) and the eager eagle3.
    for name in ("w4a16", "eagle3", "ngram", "w4a16-131k"):
        assert _kv(node, node.catalogue().load(name)) == [], name
    w4a16 = node.catalogue().load("w4a16")
    _record(node, w4a16, facts={"kv_cache_tokens": 270_592, "available_kv_gib": 12.39})
    assert _kv(node, w4a16) == []


def test_a_lint_of_many_stacks_reads_each_revision_once_and_agrees_with_one_at_a_time(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lint --all` shares one RevisionMemory: the same measurement per stack as a preflight of
    that stack alone, each revision's files read at most once, none of another image read."""
    first = _first_boot(node)
    numbers = [_record(node, first, facts={"available_kv_gib": 11.74 + n / 100}) for n in range(3)]
    w4a16 = node.catalogue().load("w4a16")
    _record(node, w4a16.model_copy(update={"image": "intel/vllm:older"}), facts={"available_kv_gib": 1.0})
    alone = {s.name: measured_kv(node, s) for s in (first, w4a16)}
    assert alone[first.name] is not None and alone[first.name].revision == numbers[-1]
    reads: list[int] = []
    real_get = RevisionStore.get

    def counting(self: RevisionStore, number: int) -> Any:
        reads.append(number)
        return real_get(self, number)

    monkeypatch.setattr(RevisionStore, "get", counting)
    memory = RevisionMemory(RevisionStore(node.state_dir))
    shared = {s.name: measured_kv(node, s, memory=memory) for s in (first, w4a16, first, w4a16)}
    assert shared == alone
    assert sorted(reads) == sorted(set(reads)), "a revision read twice"
    assert 4 not in reads, "a revision of another image was read"
