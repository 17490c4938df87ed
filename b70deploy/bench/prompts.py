"""The built-in mixed prompt set and padding to a target context.

Each bench prompt is: a nonce line (unique per run and prompt, so the server's prefix cache
never turns a prefill measurement into a cache hit), a block of filler words, then the task.
The nonce is a shuffle of a fixed set of words, not a hex string: a tokenizer that cuts text
into words before it merges (vLLM's models' BPE and SentencePiece tokenizers alike) prices
every shuffle the same, whereas hex costs whatever its run of letters and digits happens to
cost (3 tokens apart on one tokenizer: a 1.2% miss at a 256-token target).
How many tokens a given text costs is the server's business (its tokenizer, its chat
template), so padding is calibrated by asking the server: probe, read usage.prompt_tokens,
adjust. That loop is what makes the target context honest on a real vLLM too.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import OperationError, UserError

KINDS = ("code", "math", "translation", "prose", "qa")


@dataclass(frozen=True)
class BasePrompt:
    kind: str
    text: str


# Sixteen short tasks, mixed like the post's set: code, math, translation, prose, QA.
BASE_PROMPTS: tuple[BasePrompt, ...] = (
    BasePrompt("code", "Write a Python function that merges two sorted lists into one sorted list without "
                       "using sort(), and explain its running time."),
    BasePrompt("math", "A train leaves at 09:40 and travels 232 km at an average of 87 km/h. At what time "
                       "does it arrive? Show each step."),
    BasePrompt("translation", "Translate into French, keeping the tone formal: 'The maintenance window starts "
                              "at midnight and will last about two hours.'"),
    BasePrompt("prose", "Write a short paragraph describing a harbour town at dawn, from the point of view of "
                        "a fisherman mending nets."),
    BasePrompt("qa", "Why does the sky look blue during the day but red and orange near sunset? Answer in a "
                     "few sentences."),
    BasePrompt("code", "Write a SQL query that returns, for each customer, the date of their most recent "
                       "order and the total amount they spent in 2024."),
    BasePrompt("math", "Find all real solutions of x^2 - 7x + 10 = 0 and check each one by substitution."),
    BasePrompt("translation", "Translate into German: 'Please restart the server after the update has been "
                              "installed, then check the logs for errors.'"),
    BasePrompt("prose", "Write a four-sentence product description for a cast-iron kettle, without using the "
                        "word 'classic'."),
    BasePrompt("qa", "What is the difference between a process and a thread in an operating system? Give one "
                     "example of when to prefer each."),
    BasePrompt("code", "Write a Bash one-liner that prints the ten largest files under the current folder, "
                       "with human-readable sizes, and explain each part."),
    BasePrompt("math", "A shop discounts a jacket by 20% and then by a further 15%. What single discount is "
                       "that equivalent to? Explain."),
    BasePrompt("translation", "Translate into Spanish: 'The library will be closed on Monday; books can be "
                              "returned at the front desk on Tuesday.'"),
    BasePrompt("prose", "Write a short letter to a neighbour apologising for a noisy party and proposing a "
                        "way to make amends."),
    BasePrompt("qa", "How does a refrigerator move heat from inside to outside? Explain the cycle in plain "
                     "words."),
    BasePrompt("code", "Write a JavaScript function that debounces another function, and show how to use it "
                       "with a search box."),
)

# Common short English words: most tokenizers give each one token with its leading space,
# which keeps tokens per filler word nearly constant whatever the shuffle.
FILLER_WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "at", "by", "be",
    "this", "from", "or", "have", "an", "are", "but", "not", "all", "one", "had", "were", "they", "which",
    "you", "their", "has", "more", "when", "there", "can", "out", "we", "other", "up", "what", "about",
    "into", "time", "if", "so", "some", "them", "two", "see", "way", "could", "like", "then", "first", "many",
    "these", "her", "would", "make", "than", "been", "who", "its", "now", "people", "my", "made", "over",
    "did", "down", "only", "most", "find", "use", "any", "new", "work", "part", "take", "get", "place",
    "year", "live", "back", "give", "very", "after", "name", "good", "just", "where", "came", "set", "show",
    "around", "form", "three", "small", "end", "put", "home", "read", "hand", "large", "add", "even", "land",
    "here", "must", "big", "high", "such", "follow", "act", "why", "ask", "men", "change", "went", "light",
    "kind", "off", "need", "house", "try", "again", "animal", "point", "mother", "world", "near", "build",
    "self", "earth", "father", "head", "stand", "own", "page", "should", "country", "found", "answer",
    "school", "grow", "study", "still", "learn", "plant", "cover", "food", "sun", "four", "between", "state",
    "keep", "eye", "never", "last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start",
    "might", "story", "saw", "far", "sea", "draw", "left", "late", "run", "while", "press", "close", "night",
    "real", "life", "few",
)

NOTES_HEADER = "Background notes follow; they are context only and need no reply."


def filler(n_words: int, seed: str) -> str:
    """n_words filler words: whole shuffled passes over the vocabulary (order depends on the
    seed), then the first words of the vocabulary in fixed order, a full stop every 12 words.

    Every pass holds each word once, so for a tokenizer that prices words one by one the cost
    of n words is the same whatever the seed: calibration on one prompt holds for all.
    """
    rng = random.Random(seed)
    vocab = len(FILLER_WORDS)
    words: list[str] = []
    for _ in range(n_words // vocab):
        words.extend(rng.sample(FILLER_WORDS, vocab))
    words.extend(FILLER_WORDS[:n_words % vocab])
    return " ".join(" ".join(words[i:i + 12]) + "." for i in range(0, len(words), 12))


NONCE_WORDS = 16  # 16! orders: two prompts sharing a first cache block is out of reach


def nonce_line(seed: str) -> str:
    """The seed's order of the vocabulary's first NONCE_WORDS words: unique per seed, and the
    same token count for every seed (a word-by-word tokenizer sees the same words)."""
    words = random.Random(f"nonce:{seed}").sample(FILLER_WORDS[:NONCE_WORDS], NONCE_WORDS)
    return "Ref: " + " ".join(words) + "."


def compose(base: BasePrompt, n_words: int, nonce: str) -> str:
    # The frame is the same with or without filler, so tokens = bare + rate * words holds.
    return f"{nonce_line(nonce)} {NOTES_HEADER}\n{filler(max(0, n_words), nonce)}\n\nTask: {base.text}"


def pick(n: int) -> list[BasePrompt]:
    """n prompts from the set, cycling; the order mixes kinds."""
    return [BASE_PROMPTS[i % len(BASE_PROMPTS)] for i in range(n)]


@dataclass(frozen=True)
class PaddedPrompt:
    index: int
    kind: str
    text: str
    target_tokens: int
    expected_tokens: int  # what the calibration predicts the server will count


Probe = Callable[[str], int]
"""Send a text to the server, return usage.prompt_tokens."""


@dataclass
class Calibration:
    rate: float  # server tokens per filler word
    probes: int
    base_tokens: dict[int, int]
    # Where the first prompt landed: (filler words, server tokens). Other prompts are padded
    # from here by their bare costs' difference, so what the rate misses of the frame (a
    # newline merged with its neighbours, a full stop more) is counted once, not scaled.
    anchor: tuple[int, int]


def calibrate_rate(probe: Probe, base: BasePrompt, nonce: str, target: int, *, tolerance: float = 0.0025,
                   max_probes: int = 6, guess: float = 1.3) -> tuple[float, int, tuple[int, int], int]:
    """Server tokens per filler word, found by secant steps on one prompt until a probe at
    the predicted padding lands within `tolerance` of `target`.

    The rate is the slope between the two padded probes farthest apart (the first is at half
    the guessed padding), never from the bare prompt: padding changes the frame around it too
    (the newlines beside the filler), which a slope from zero words would spread over every
    word. Returns (rate, bare tokens, the probe nearest the target as (words, tokens), probes
    used)."""
    c0 = probe(compose(base, 0, nonce))
    used = 1
    if target <= c0:
        raise UserError(f"target context {target} is shorter than the bare prompt ({c0} tokens)",
                        where="--ctx", fix=f"give a context above {c0} tokens")
    points: list[tuple[int, int]] = []
    rate = guess
    words = max(1, round((target - c0) / rate / 2))
    for _ in range(max_probes):
        got = probe(compose(base, words, nonce))
        used += 1
        if got <= c0:
            raise OperationError(f"the server counted {got} prompt tokens for a padded prompt "
                                 f"(bare: {c0}); padding does not register as tokens")
        points.append((words, got))
        (w1, g1), (w2, g2) = min(points), max(points)
        rate = (g2 - g1) / (w2 - w1) if g2 > g1 and w2 > w1 else (got - c0) / words
        anchor = min(points, key=lambda p: abs(p[1] - target))
        if len(points) >= 2 and abs(anchor[1] - target) <= tolerance * target:
            break
        words = max(1, anchor[0] + round((target - anchor[1]) / rate))
    return rate, c0, anchor, used


def calibrate(n: int, target: int, probe: Probe, calib_prefix: str, *, tolerance: float = 0.0025) -> Calibration:
    """Tokens per filler word and the bare cost of each distinct task, asked of the server.

    Probes carry nonces seeded under `calib_prefix`: the measured prompts' nonce words in other
    orders, so they cost the same tokens and share no prefix with anything the server saw while
    calibrating.
    """
    if not 1 <= n <= 999:
        raise UserError(f"{n} prompts is out of range", where="--n-prompts", fix="give 1 to 999")
    bases = pick(n)
    rate, c0, anchor, used = calibrate_rate(probe, bases[0], f"{calib_prefix}-p000", target, tolerance=tolerance)
    base_tokens = {0: c0}
    for i, base in enumerate(bases[:len(BASE_PROMPTS)]):
        if i not in base_tokens:
            base_tokens[i] = probe(compose(base, 0, f"{calib_prefix}-p{i:03d}"))
            used += 1
        if base_tokens[i] >= target:
            raise UserError(f"target context {target} is shorter than prompt {i} ({base_tokens[i]} tokens)",
                            where="--ctx", fix=f"give a context above {base_tokens[i]} tokens")
    return Calibration(rate=rate, probes=used, base_tokens=base_tokens, anchor=anchor)


def materialize(cal: Calibration, n: int, target: int, nonce_prefix: str) -> list[PaddedPrompt]:
    """n prompts padded to `target` server tokens, with nonces under `nonce_prefix`.

    A fresh prefix per run keeps the prefix cache out of the measurement.
    """
    anchor_words, anchor_tokens = cal.anchor
    anchor_filler = anchor_tokens - cal.base_tokens[0]  # what the anchor's padding cost
    prompts: list[PaddedPrompt] = []
    for i, base in enumerate(pick(n)):
        bare = cal.base_tokens[i % len(BASE_PROMPTS)]
        words = max(0, anchor_words + round((target - bare - anchor_filler) / cal.rate))
        expected = bare + anchor_filler + round((words - anchor_words) * cal.rate)
        prompts.append(PaddedPrompt(i, base.kind, compose(base, words, f"{nonce_prefix}-p{i:03d}"), target, expected))
    return prompts


def off_by(actual: int, target: int) -> float:
    """Relative difference of a server-reported count from the target."""
    return (actual - target) / target if target else 0.0
