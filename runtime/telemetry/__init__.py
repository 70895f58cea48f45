"""Router telemetry: Prometheus metrics with a per-stage latency breakdown, and JSON logs."""
