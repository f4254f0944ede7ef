"""Koi: a self-calibrating cluster planner for heterogeneous, multi-cloud LLM inference fleets.

``koi`` is the domain library: catalog, decision space, job specs, predictor (and,
later, causal beliefs, proposer, composer, placer, simulator). It never imports
transport code (nats, grpc, generated ``_pb2`` modules) except in ``koi.wire``,
``koi.bus`` and the CLI.
"""

__version__ = "0.1.0"
