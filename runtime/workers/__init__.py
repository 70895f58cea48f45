"""Inference workers: vLLM supervisor, PyTorch CPU worker, simulator (docs/design.md)."""
