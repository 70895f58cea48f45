"""A vLLM-compatible simulator for tests and benchmarks on machines without GPUs.

It speaks vLLM's OpenAI-compatible HTTP API and exposes vLLM's ``/metrics`` names, with a
timing model (prefill throughput, decode step time growing with batch size, a KV-cache
capacity and a cap on concurrent sequences) and a priority-ordered waiting queue. It never
runs a model and is never a production backend.

Modules: ``timing`` (the timing model), ``config`` (parameters), ``text`` (stand-in tokenizer
and deterministic output), ``engine`` (the scheduler loop), ``metrics`` (Prometheus),
``protocol`` (request parsing and validation), ``wire`` (response bodies and SSE frames),
``server`` (the aiohttp app), ``__main__`` (the command line).
"""
