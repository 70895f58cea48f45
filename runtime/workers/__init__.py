"""Inference workers: vLLM supervisor, PyTorch CPU worker, simulator (DESIGN.md §4.6)."""
