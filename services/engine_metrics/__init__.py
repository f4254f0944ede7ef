"""engine-metrics: the fleet engines' own /metrics (scraped, or through Prometheus) →
the per-tick telemetry batch telemetry-ingest reads."""
