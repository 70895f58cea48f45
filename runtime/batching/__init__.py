"""Router-side coalescing of unary requests into upstream batches (DESIGN §4.2)."""
