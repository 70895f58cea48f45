"""The encoder the PyTorch worker serves: a BERT-style model with mean pooling, on the CPU or a
CUDA device (:func:`resolve_device`: ``auto`` is CUDA when torch sees one).

:class:`Encoder` loads a sentence-transformers folder (``config.json``, ``model.safetensors``,
tokenizer files; all-MiniLM-L6-v2 in the demo) with ``transformers`` and computes what
sentence-transformers computes: token embeddings, mean over the attention mask, L2
normalisation. Classification is a linear head over the pooled embedding whose weights are
generated from a seed (a demo head, not a trained one): label scores are its softmax.

Inputs arrive as token ids (the server tokenizes); one call runs one padded batch under
``torch.inference_mode``. Nothing here is asynchronous: the batcher calls it from one thread.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_LABELS = ("negative", "neutral", "positive")
DEFAULT_HEAD_SEED = 13
DEVICES = ("auto", "cpu", "cuda")


class InputError(ValueError):
    """One input cannot be encoded (empty, token ids out of the vocabulary)."""


def resolve_device(requested: str, *, cuda_available: bool) -> str:
    """``auto`` -> ``cuda`` when a CUDA device is there, else ``cpu``; ``cuda`` without one is
    a ValueError (a GPU worker must not fall back to the CPU silently)."""
    if requested not in DEVICES:
        raise ValueError(f"unknown device {requested!r}: choose one of {', '.join(DEVICES)}")
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ValueError(
            "device cuda was asked for but torch sees no CUDA device (a CPU build of torch, "
            "or no driver): use --device cpu or auto"
        )
    return requested


@dataclass(frozen=True, slots=True)
class EncoderInfo:
    dimensions: int
    max_tokens: int
    vocab_size: int
    labels: tuple[str, ...]


class Encoder:
    """A loaded encoder; build it with :meth:`load` (slow: reads the weights)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        head: Any,
        info: EncoderInfo,
        *,
        threads: int,
        device: str = "cpu",
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._head = head
        self.info = info
        self.threads = threads
        self.device = device

    @classmethod
    def load(
        cls,
        folder: Path,
        *,
        threads: int,
        device: str = "cpu",
        labels: Sequence[str] = DEFAULT_LABELS,
        head_seed: int = DEFAULT_HEAD_SEED,
    ) -> Encoder:
        """Load ``folder`` on ``device`` (``auto``/``cpu``/``cuda``; ValueError when ``cuda`` is
        asked for and torch sees none)."""
        import torch  # noqa: PLC0415 - heavy; only the worker process imports it
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415

        if threads < 1:
            raise ValueError("threads must be at least 1")
        device = resolve_device(device, cuda_available=bool(torch.cuda.is_available()))
        torch.set_num_threads(threads)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True)
        model.eval()
        max_tokens = _max_seq_length(folder, tokenizer)
        dimensions = int(model.config.hidden_size)
        generator = torch.Generator().manual_seed(head_seed)
        head = torch.nn.Linear(dimensions, len(labels))
        with torch.no_grad():
            bound = 1.0 / math.sqrt(dimensions)
            head.weight.uniform_(-bound, bound, generator=generator)
            head.bias.zero_()
        head.eval()
        model.to(device)
        head.to(device)
        info = EncoderInfo(
            dimensions=dimensions,
            max_tokens=max_tokens,
            vocab_size=int(model.config.vocab_size),
            labels=tuple(labels),
        )
        return cls(model, tokenizer, head, info, threads=threads, device=device)

    # --- tokenization (cheap; on the event loop) -----------------------------------------

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with [CLS]/[SEP], truncated to ``max_tokens`` (as sentence-transformers)."""
        encoded = self._tokenizer(
            list(texts), truncation=True, max_length=self.info.max_tokens, padding=False
        )
        return [list(ids) for ids in encoded["input_ids"]]

    def check_ids(self, ids: Sequence[int]) -> list[int]:
        """Validate a client's token array; returns it truncated to ``max_tokens``."""
        if not ids:
            raise InputError("a token array must not be empty")
        vocab = self.info.vocab_size
        for token in ids:
            if not 0 <= token < vocab:
                raise InputError(f"token id {token} is outside the vocabulary (0..{vocab - 1})")
        return list(ids[: self.info.max_tokens])

    # --- compute (one padded batch; blocking) --------------------------------------------

    def embed(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """Normalised mean-pooled embeddings of a batch of token-id lists."""
        return [row.tolist() for row in self._pooled(batch).cpu()]

    def classify(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """Label probabilities (softmax of the seeded head) for each input."""
        import torch  # noqa: PLC0415

        with torch.inference_mode():
            logits = self._head(self._pooled(batch))
            return [row.tolist() for row in torch.softmax(logits, dim=-1).cpu()]

    def _pooled(self, batch: Sequence[Sequence[int]]) -> Any:
        import torch  # noqa: PLC0415

        if not batch:
            raise InputError("empty batch")
        width = max(len(ids) for ids in batch)
        input_ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        if self.device != "cpu":
            input_ids = input_ids.to(self.device, non_blocking=True)
            mask = mask.to(self.device, non_blocking=True)
        with torch.inference_mode():
            out = self._model(input_ids=input_ids, attention_mask=mask)
            tokens = out.last_hidden_state
            weights = mask.unsqueeze(-1).to(tokens.dtype)
            summed = (tokens * weights).sum(dim=1)
            pooled = summed / weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)


def _max_seq_length(folder: Path, tokenizer: Any) -> int:
    """sentence-transformers' ``max_seq_length`` if the folder says, else the tokenizer's."""
    try:
        config = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8"))
        value = int(config["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        value = int(getattr(tokenizer, "model_max_length", 512))
    return max(2, min(value, 512))
