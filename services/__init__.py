"""Koi's services on the NATS bus: thin adapters over the domain code in ``koi``.

Each ``services/<name>/`` is one process (``koi serve <name>``); ``services.runtime``
holds what they share (bus plumbing, embedded servers, the prediction cache, logging).
Domain logic never lives here.
"""
