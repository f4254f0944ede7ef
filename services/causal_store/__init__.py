"""causal-store: owns the scoped beliefs, the playbook of mechanisms and the DRO
calibration; folds each tick's observations in."""
