"""telemetry-ingest: raw per-deployment telemetry → observations (measured next to
predicted) for the causal store."""
