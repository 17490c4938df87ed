"""A random-weights Qwen3 model folder of a published shape, for the GPU lane: no hub, no download.

    python scripts/gpu_model.py OUT_DIR [--shape qwen3-0.6b] [--device cuda]

The shapes are the config.json numbers Qwen publishes for Qwen3-0.6B, -1.7B and -8B (hidden size,
layers, heads, head_dim, vocabulary, tied embeddings): vLLM sizes its memory, kernels and CUDA graphs
from them, so boot, sleep and wake cost what they cost for the real checkpoint of that shape. The weights
are normal(0, 0.02) in bfloat16 from a fixed seed: the output is nonsense, but the same nonsense for the
same prompt, which is what the lane compares before and after a sleep.

The tokenizer is a byte-level BPE of Qwen's 151,643 regular tokens, trained on tiny_model.py's text and
pseudo-words from a seeded generator (random weights pick ids all over the vocabulary: a smaller
tokenizer would decode most of them to nothing), with no special token ahead of the alphabet, so that
id 0 is "!" as in Qwen's own vocabulary: a server that generates token id 0 (a level-2 sleeper woken
without its weights) prints "!!!!", as the real one would with the real tokenizer. Needs torch,
transformers, tokenizers and safetensors (the device's Python has them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_model  # the corpus and the chat template of the CPU lane's model

SEED = 20261206
VOCAB_TRAINED = 151643   # Qwen3's regular tokens; the specials follow
WORDS = 200000
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's published config.json of each size (huggingface.co/Qwen/Qwen3-*/blob/main/config.json).
SHAPES: dict[str, dict[str, int | bool]] = {
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                   "tie_word_embeddings": True},
    "qwen3-1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                   "tie_word_embeddings": True},
    "qwen3-8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "tie_word_embeddings": False},
}
QWEN3 = {"vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
         "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False}


def corpus() -> list[str]:
    rng = random.Random(SEED)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(4, 9))) for _ in range(WORDS)]
    return tiny_model.corpus() + [" ".join(words[i:i + 20]) for i in range(0, WORDS, 20)]


def build_tokenizer(out: Path) -> dict[str, int]:
    """Train the tokenizer; returns the ids of the special tokens (added after the trained vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TRAINED, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(tiny_model.ADDED)
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL + tiny_model.ADDED}
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": t in SPECIAL} for t, i in ids.items()}
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": QWEN3["max_position_embeddings"],
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "added_tokens_decoder": decoder, "clean_up_tokenization_spaces": False,
        "chat_template": tiny_model.CHAT_TEMPLATE})
    return ids


def build_weights(out: Path, shape: str, eos: int, pad: int, device: str) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(**QWEN3, **SHAPES[shape], bos_token_id=eos, eos_token_id=eos, pad_token_id=pad,
                         initializer_range=0.02)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    cfg.pop("transformers_version", None)
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad})


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokenizer-only", action="store_true", help="Write the tokenizer files alone (a CPU check).")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(out)
    if not args.tokenizer_only:
        build_weights(out, args.shape, ids["<|im_end|>"], ids["<|endoftext|>"], args.device)
    print(f"gpu_model: wrote {out} ({args.shape}, tokenizer {VOCAB_TRAINED} + {len(ids)} added)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
