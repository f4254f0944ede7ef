"""proposer: per-job candidate configurations for a tick, guided by the running
deployments' mediators and the playbook's mechanisms."""
