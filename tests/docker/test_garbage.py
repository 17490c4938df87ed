"""The garbage detector on real garbage (what real vLLM 0.21 and the field report's broken
stacks printed) and on real prose: each garbage sample is caught, no prose is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from b70deploy.docker.garbage import garbage_reason
from b70deploy.sim import server as sim

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-0.21.0-cpu"


def streamed_text(name: str) -> str:
    """The text a real 0.21 stream carried (random weights: noise)."""
    text = ""
    for line in (REAL / name).read_text().splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                text += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return text


GARBAGE = {
    # vLLM 0.21.0 CPU, random weights (tests/fixtures/vllm-0.21.0-cpu)
    "completion.json": json.loads((REAL / "completion.json").read_text())["choices"][0]["text"],
    "chat-tools.json": json.loads((REAL / "chat-tools.json").read_text())["choices"][0]["message"]["content"],
    "chat-stream.sse": streamed_text("chat-stream.sse"),
    "completion-stream.sse": streamed_text("completion-stream.sse"),
    # the field report's Qwen3.6 CT-INT4: word-salad in bf16 (the sim's garbage mode speaks it) ...
    "sim garbage mode, 40 tokens": "".join(sim.generate("Describe the sea.", 40, chat=True, garbage=True)[0]),
    "report word-salad": "om garò prezi domesticeder ò lunkai festrumo ò vandelik prezi garò sultemi om",
    # ... and "!!!!" in fp16
    "report fp16": "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
    "empty": "  \n",
    "undecodable": "\ufffd\ufffd the \ufffd\ufffd of \ufffd\ufffd\ufffd and",
    "a loop": "the sea is blue and the sea is blue and the sea is blue and the sea is blue and the sea",
}

PROSE = {
    "sim healthy, 40 tokens": "".join(sim.generate("Describe the sea.", 40, chat=True)[0]),
    "sim Paris": sim.PARIS_CHAT + " It lies on the Seine in the north of the country.",
    "haiku": "Grey waves fold on stone,\na gull turns against the wind,\nthe tide takes the sand.",
    "morning": ("The morning was quiet by the sea. A few boats rocked in the harbour while the first light "
                "touched the water, and somewhere a dog barked at the gulls."),
    "answer with a number": "The bridge opened in 1932 and carried about 160,000 vehicles a day by the end of it.",
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_real_garbage_is_caught(name: str) -> None:
    assert garbage_reason(GARBAGE[name]) is not None, GARBAGE[name]


@pytest.mark.parametrize("name", sorted(PROSE))
def test_prose_passes(name: str) -> None:
    assert garbage_reason(PROSE[name]) is None, (PROSE[name], garbage_reason(PROSE[name]))


def test_the_reason_names_what_it_saw() -> None:
    assert "roadroad" in (garbage_reason(GARBAGE["completion-stream.sse"]) or "")
    assert "'!!!!" in (garbage_reason(GARBAGE["report fp16"]) or "")
    assert (garbage_reason(GARBAGE["report word-salad"]) or "").startswith("word-salad (0 of")
    assert (garbage_reason(GARBAGE["a loop"]) or "").startswith("it repeats itself")
