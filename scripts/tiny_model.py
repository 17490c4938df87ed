"""Build a tiny Qwen3-architecture model folder for the real-vLLM lane: no hub, same bytes every run.

    python scripts/tiny_model.py OUT_DIR [--head-dim 64]

Random float32 weights (a fixed seed, drawn parameter by parameter in name order with our own
generator, so the bytes do not depend on how a transformers release initialises modules) and a
byte-level BPE tokenizer trained here on text this script carries. The tokenizer knows Qwen's
chat-template special tokens and the <tool_call> tokens vLLM's hermes tool parser looks up at
start-up; the chat template is ours, in Qwen's ChatML shape, with tools.

head_dim 64 serves. head_dim 16 boots and answers /health, then vLLM's CPU attention rejects it
on the first request: a real die-after-ready.

Run it with the vLLM venv's Python (it needs torch, transformers, tokenizers, safetensors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SEED = 20260516
VOCAB = 2048
HIDDEN = 128
LAYERS = 2
HEADS = 2
KV_HEADS = 1
INTERMEDIATE = 256
MAX_POSITIONS = 2048
STD = 0.02

# Special tokens first, so their ids are fixed: 0.. in this order.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Plain added tokens: the hermes parser needs the tool-call pair in the vocab, Qwen3 has think tags.
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

# Our own ChatML template with tools: a system block that lists the tools, assistant tool calls
# as <tool_call>{json}</tool_call>, tool results as a user turn wrapping <tool_response>.
CHAT_TEMPLATE = (
    # transformers renders with trim_blocks: a newline right after a tag is dropped, so the
    # newlines that matter are written as {{ '\n' }} next to tags.
    "{% if tools %}"
    "<|im_start|>system{{ '\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{{ '\n\n' }}{% endif %}"
    "You may call functions. Their signatures:\n<tools>"
    "{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}{{ '\n' }}</tools>\n"
    "To call one, answer with <tool_call>{\"name\": NAME, \"arguments\": ARGS}</tool_call>.<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system{{ '\n' }}{{ messages[0].content }}<|im_end|>{{ '\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>{{ '\n' }}"
    "{% else %}"
    "<|im_start|>{{ message.role }}{{ '\n' }}"
    "{% if message.content is string %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{{ '\n' }}<tool_call>\n{\"name\": \"{{ fn.name }}\", \"arguments\": "
    "{{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}"
    "<|im_end|>{{ '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}"
)

# Training text we wrote for this purpose: prose about the lane, some code and numbers, so that
# BPE finds enough merges to fill the vocabulary.
CORPUS = """\
The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.
A deployment tool stops the old stack, starts the new one, waits for health, and rolls back
when the smoke test fails. An operator reads one line at the end that says what state the
node is in. The model here is tiny and its weights are random, so its answers are noise.
Tokens are pieces of text; a tokenizer splits text into tokens and joins them back again.
The quick brown fox jumps over the lazy dog while the server answers health checks.
Every request carries a prompt, a model name, a temperature, and a limit on new tokens.
Streaming answers arrive as server-sent events, one chunk at a time, then a final done line.
What is the weather in Berlin today? It is cold and windy, with rain in the evening.
Please call the tool get_weather with the city name and return the temperature in Celsius.
def handler(request):
    body = request.json()
    if body.get("stream"):
        return stream(body)
    return {"id": body["id"], "choices": [], "usage": {"prompt_tokens": 0}}
for i in range(10):
    print(i, i * i, hex(i))
{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}}
<tool_call>{"name": "lookup", "arguments": {"query": "vllm"}}</tool_call>
"""

WORD_TEXT = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega red green blue "
         "yellow black white north south east west spring summer autumn winter morning night "
         "river mountain forest ocean desert island city village road bridge tower garden "
         "engine switch rollback health smoke bench stack image container volume network port "
         "request response token prompt answer question model weight layer head cache memory")


def corpus() -> list[str]:
    """The fixed text above plus lines made from it by a deterministic rule (no randomness)."""
    lines = CORPUS.splitlines()
    words = WORD_TEXT.split()
    n = len(words)
    for i in range(1200):
        a, b, c = words[i % n], words[(i * 7 + 3) % n], words[(i * 13 + 5) % n]
        lines.append(f"{a} {b} {c} {i} {i * 37 % 1000}: {a.capitalize()}{b}_{c}({i % 17}, '{c[::-1]}')")
    return lines


def build_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(ADDED),  # the added tokens take the last ids
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens(ADDED)
    tok.save(str(out / "tokenizer.json"))
    added_decoder = {}
    for token in SPECIAL + ADDED:
        added_decoder[str(tok.token_to_id(token))] = {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": token in SPECIAL,
        }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITIONS,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": SPECIAL[1:],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", config)
    return tok.get_vocab_size()


def build_weights(out: Path, head_dim: int, eos_id: int, pad_id: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=head_dim,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False, torch_dtype="float32",
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id, initializer_range=STD,
    )
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)  # only for parameter names and shapes
    gen = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {}
    for name, param in sorted(model.state_dict().items()):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(param.shape, dtype=torch.float32)
        else:
            tensors[name] = torch.randn(param.shape, generator=gen, dtype=torch.float32) * STD
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # save_file makes it 0600; other users read models too
    cfg = config.to_dict()
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    cfg.pop("transformers_version", None)  # keep the bytes independent of the installed release
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json",
                {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": pad_id})


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    size = build_tokenizer(out)
    if size != VOCAB:
        print(f"tiny_model: tokenizer has {size} tokens, wanted {VOCAB}", file=sys.stderr)
        return 1
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eos, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    build_weights(out, args.head_dim, eos, pad)
    print(f"tiny_model: wrote {out} (head_dim {args.head_dim}, vocab {size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
