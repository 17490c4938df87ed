"""Is a short free-form generation language or garbage? Judged without an expected answer.

The coherence smoke test asks for a few sentences of prose (~40 tokens) and asks this module
whether they read as English. The garbage it must catch is what broken stacks really printed:
the field report's Qwen3.6 quant spoke word-salad ("om garò prezi domesticeder ò…") or, in
fp16, runs of "!!!!"; vLLM 0.21 with random weights printed "htlaehroadroadroad",
"Peresponseeresponse…" and " 517 876 615deltaeulbit" (tests/fixtures/vllm-0.21.0-cpu). Each
rule is deterministic and names what it saw; the first that fires is the verdict.
"""

from __future__ import annotations

import re
import unicodedata

# Function words: any English prose of a sentence or two is full of them; word-salad has none.
_COMMON_WORDS = """
a about after all also an and any are as at be because been before but by can could did do does
each for from had has have he her here his how i if in into is it its just like more most my no
not now of on one only or other our out over she so some than that the their them then there these
they this those through to under up very was we were what when where which while who will with
would you your
"""
COMMON = frozenset(_COMMON_WORDS.split())

MIN_WORDS = 6            # a 40-token answer in prose has far more
MIN_COMMON = 0.12        # share of words that are function words (prose: 0.3-0.5)
MIN_DISTINCT = 0.5       # distinct 3-word sequences / all of them
MIN_LETTERS = 0.6        # letters among the non-space characters
MAX_WORD = 24            # letters in one word ("internationalization" has 20)
MAX_CONTROL = 0.02       # control / replacement characters among all characters

_WORD = re.compile(r"[^\W\d_]+")
_PUNCT_RUN = re.compile(r"([^\w\s])\1{3,}")
_STUTTER = re.compile(r"([^\W\d_]{3,})\1{2,}")   # a piece repeated inside one word: roadroadroad


def degenerate_reason(text: str) -> str | None:
    """Why a few tokens are what a broken engine emits whatever the model, or None: undecodable
    characters, or one punctuation mark over and over (token id 0, "!" in Qwen's vocabulary, is what
    a level-2 wake without its weights reloaded answers: reference/gpu-lane.md). For a check of a few
    tokens, too short for the language rules of garbage_reason."""
    control = sum(1 for c in text if c == "\ufffd" or (unicodedata.category(c).startswith("C") and c not in "\n\t\r"))
    if control > MAX_CONTROL * len(text):
        return f"{control} non-printable or undecodable characters"
    if m := _PUNCT_RUN.search(text):
        return f"a run of {m.group(0)[:8]!r}"
    return None


def garbage_reason(text: str) -> str | None:
    """Why `text` is not language (one short phrase), or None when it reads as English prose."""
    if not text.strip():
        return "no text at all"
    if why := degenerate_reason(text):
        return why
    visible = [c for c in text if not c.isspace()]
    letters = sum(1 for c in visible if c.isalpha())
    if letters < MIN_LETTERS * len(visible):
        return f"only {letters} of {len(visible)} characters are letters"
    if m := _STUTTER.search(text):
        return f"a word that stutters ({m.group(0)[:24]!r})"
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < MIN_WORDS:
        return f"only {len(words)} words"
    longest = max(words, key=len)
    if len(longest) > MAX_WORD:
        return f"a {len(longest)}-letter word ({longest[:24]!r}...)"
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    if trigrams and len(set(trigrams)) < MIN_DISTINCT * len(trigrams):
        return f"it repeats itself ({len(set(trigrams))} distinct of {len(trigrams)} three-word runs)"
    common = sum(1 for w in words if w in COMMON)
    if common < MIN_COMMON * len(words):
        return f"word-salad ({common} of {len(words)} words are common English words)"
    return None
