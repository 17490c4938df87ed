"""watch's decision table: looks in, acts out (pure; the real loop is in test_watch_engine.py)."""

from __future__ import annotations

import pytest

from b70deploy.watch.decide import Look, Memory, Problem, Subject, decide, remember

T0 = 1_000_000.0
DIED = Problem("died", "the vllm container died 1 time(s) (exit 0)", "EngineDeadError: worker failed")
SMOKE = Problem("smoke", "smoke failed: completion returned 'salad'")


def subject(*, kind: str = "switch", parent: int | None = 1, parent_healthy: bool = True,
            committed: float | None = T0, bake: float = 900.0) -> Subject:
    return Subject(revision=2, stack="beta", kind=kind, parent=parent, parent_healthy=parent_healthy,
                   committed_at=committed, bake_seconds=bake)


def look(after: float, s: Subject | None = None, *problems: Problem, busy: str | None = None,
         drift: tuple[str, ...] = ()) -> Look:
    return Look(T0 + after, s if s is not None else subject(), busy=busy, problems=problems, drift=drift)


@pytest.mark.parametrize(("case", "the_look", "memory", "want"), [
    ("healthy inside the bake: nothing", look(10), Memory(), []),
    ("failure inside the bake: roll back to the parent", look(10, None, DIED), Memory(), [("rollback", 1)]),
    ("failure after the bake: alert only", look(901, None, DIED), Memory(), [("alert", None)]),
    ("second failure of a revision watch rolled back: alert only", look(10, None, DIED),
     Memory(rolled_back=frozenset({2})), [("alert", None)]),
    ("a rollback's revision is never rolled back by watch", look(10, subject(kind="rollback"), DIED),
     Memory(), [("alert", None)]),
    ("no parent: alert", look(10, subject(parent=None), DIED), Memory(), [("alert", None)]),
    ("unhealthy parent: alert", look(10, subject(parent_healthy=False), DIED), Memory(), [("alert", None)]),
    ("unknown commit time: alert", look(10, subject(committed=None), DIED), Memory(), [("alert", None)]),
    ("a deploy holds the lock: a note, no action",
     look(10, None, DIED, busy="a deploy holds the lock (pid 7 `switch x`)"), Memory(), [("note", None)]),
    ("drift: reported, failures of someone else's container not acted on",
     look(10, None, DIED, drift=("the vllm container runs stack gamma",)), Memory(), [("drift", None)]),
    ("per-stack bake of 5 s: 6 s later alerts", look(6, subject(bake=5.0), SMOKE), Memory(), [("alert", None)]),
    ("nothing deployed: nothing", Look(T0, None), Memory(), []),
])
def test_decision_table(case: str, the_look: Look, memory: Memory, want: list[tuple[str, int | None]]) -> None:
    acts = decide(the_look, memory)
    assert [(a.what, a.to) for a in acts] == want, case


def test_rollback_carries_every_problem_and_the_diagnosis() -> None:
    [act] = decide(look(10, None, SMOKE, DIED), Memory())
    assert act.what == "rollback" and act.to == 1 and act.revision == 2
    assert act.text.startswith("the vllm container died")  # the problem with the diagnosis leads
    assert "smoke failed" in act.text and act.diagnosis == DIED.diagnosis


def test_alerts_are_said_once_and_rollback_is_remembered() -> None:
    mem = Memory()
    acts = decide(look(901, None, DIED, SMOKE), mem)
    assert [a.what for a in acts] == ["alert", "alert"]
    assert all("after the 900 s bake window" in a.text for a in acts)
    mem = remember(mem, acts)
    assert decide(look(902, None, DIED, SMOKE), mem) == []
    rb = decide(look(5, None, DIED), Memory())
    mem = remember(Memory(), rb)
    assert mem.rolled_back == frozenset({2})
    [again] = decide(look(6, None, DIED), mem)
    assert again.what == "alert" and "once already" in again.text
