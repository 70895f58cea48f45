"""``python -m bench.encoder_model --like DIR --out DIR``: a model folder with DIR's architecture
and tokenizer and generated (seeded) weights.

For the device kit (bench/device/encoder.sh): all-MiniLM-L6-v2's 90 MB of weights do not fit in
what can be carried to a GPU machine, and the encoder's throughput and latency depend on the
model's shape only, so the kit carries MiniLM's config and tokenizer files and makes the weights
there. Its embeddings mean nothing; its timings are MiniLM's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

# What the encoder worker reads besides the weights (runtime/workers/encoder/model.py).
SHAPE_FILES = (
    "config.json", "sentence_bert_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.txt", "modules.json",
)  # fmt: skip


def copy_shape(like: Path, out: Path) -> list[str]:
    """Copy ``like``'s architecture and tokenizer files (not its weights) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in SHAPE_FILES:
        if (like / name).is_file():
            shutil.copy2(like / name, out / name)
            copied.append(name)
    if "config.json" not in copied:
        raise SystemExit(f"{like} has no config.json: not a transformers model folder")
    return copied


def make(like: Path, out: Path, *, seed: int = 20261126) -> Path:
    """``out`` with ``like``'s shape files and weights generated from ``seed`` (safetensors)."""
    import torch  # noqa: PLC0415 - heavy
    from transformers import AutoConfig, AutoModel  # noqa: PLC0415

    copy_shape(like, out)
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(out), local_files_only=True)
    model = AutoModel.from_config(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.encoder_model")
    parser.add_argument("--like", type=Path, required=True, help="Folder with config + tokenizer.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument(
        "--shape-only", action="store_true", help="Copy the shape files only (make the kit)."
    )
    args = parser.parse_args(argv)
    if args.shape_only:
        print(" ".join(copy_shape(args.like, args.out)))
    else:
        print(make(args.like, args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
