"""The simulator as the cluster: consumes each tick's actions, emits the next snapshot,
the telemetry of the tick just simulated, and the jobs submitted over the bus."""
