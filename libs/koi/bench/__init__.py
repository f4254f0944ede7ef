"""Benchmarks: predictor speed and accuracy now; scenarios and policies later."""
