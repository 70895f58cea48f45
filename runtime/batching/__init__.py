"""Router-side coalescing of unary requests into upstream batches (docs/design.md)."""
