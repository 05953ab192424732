"""Makes the tiny random-weight Llama the real-engine tests serve: deterministic, local, no hub.

Run with the vLLM venv's python (it has torch, transformers, sentencepiece and safetensors; the
project's own venv never gets torch):

    python scripts/tiny_model.py OUT_DIR [--gguf-from LLAMA_CPP_TREE]

OUT_DIR/hf    Hugging Face format (config, safetensors in bfloat16, SentencePiece tokenizer) for vLLM
OUT_DIR/model-q8_0.gguf   the same model for llama.cpp, made by that tree's convert_hf_to_gguf.py

The tokenizer is trained on text generated here from a seeded generator, the weights come from a
seeded torch generator; the sizes are in SPEC. Random weights give garbage text, but scheduling,
batching and metrics are the engine's real ones. ~100M parameters keeps a 2-core CPU at tens to a
few hundred tokens per second, so a request of a few hundred tokens lasts seconds: long enough to
freeze an engine with work in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

SPEC = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 4096,
    "vocab_size": 2000,
}
SEED = 13


def corpus(path: Path) -> None:
    """Deterministic text: pseudo-words from syllables, sentences of them."""
    rng = random.Random(SEED)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(6000)]
    words += ["the", "a", "of", "and", "to", "in", "is", "it", "that", "hello", "world", "server",
              "health", "engine", "token", "request", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
    lines = []
    for _ in range(30000):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "?", "!", ","]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def tokenizer(hf: Path, work: Path) -> None:
    import sentencepiece as spm

    corpus(work / "corpus.txt")
    # relative paths: the trainer records them in the model file, which then is the same on every machine
    here = os.getcwd()
    os.chdir(work)
    try:
        spm.SentencePieceTrainer.train(
            input="corpus.txt", model_prefix="tokenizer", vocab_size=SPEC["vocab_size"],
            model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=1,
            shuffle_input_sentence=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            minloglevel=2,
        )
    finally:
        os.chdir(here)
    (hf / "tokenizer.model").write_bytes((work / "tokenizer.model").read_bytes())
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "model_max_length": SPEC["max_position_embeddings"],
        "legacy": False,
    }, indent=1))
    (hf / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=1))


def weights(hf: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**SPEC, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         rms_norm_eps=1e-5, rope_theta=10000.0, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(hf), safe_serialization=True)
    (hf / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def gguf(hf: Path, out: Path, tree: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"), HF_HUB_OFFLINE="1", NO_LOCAL_GGUF="")
    subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(hf), "--outtype", "q8_0",
                    "--outfile", str(out)], check=True, env=env, cwd=str(tree))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gguf-from", type=Path, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)")
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    out: Path = args.out
    hf = out / "hf"
    if not (hf / "model.safetensors").exists():
        tmp = out / "hf.tmp"
        work = out / "work"
        for d in (tmp, work):
            d.mkdir(parents=True, exist_ok=True)
        tokenizer(tmp, work)
        weights(tmp)
        tmp.rename(hf)
    if args.gguf_from is not None:
        target = out / "model-q8_0.gguf"
        if not target.exists():
            part = out / "model-q8_0.gguf.part"
            gguf(hf, part, args.gguf_from)
            part.rename(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
