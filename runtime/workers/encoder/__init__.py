"""The PyTorch CPU encoder worker: model, dynamic batcher, HTTP API, life cycle."""
