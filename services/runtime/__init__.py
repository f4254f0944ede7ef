"""What every Koi service shares: settings from the environment, the bus plumbing,
embedded servers for one-machine runs, the Redis prediction cache and logging."""
