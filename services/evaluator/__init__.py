"""evaluator: numba prediction (cached in Redis) and robust scoring of every candidate,
then the composed cluster plan."""
