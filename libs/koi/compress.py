"""Bounded zlib: the causal store's and the calibrator's state travel compressed, and a
few kilobytes from the bus can inflate to gigabytes (a zip bomb). ``inflate`` stops at
``max_bytes`` and says so instead of exhausting memory."""

from __future__ import annotations

import zlib

# The largest state a store writes is a few MB of JSON (tens of thousands of beliefs);
# 256 MiB leaves two orders of magnitude of headroom and still fits any service.
MAX_INFLATED_BYTES = 256 * 1024 * 1024


def deflate(data: bytes, level: int = 1) -> bytes:
    return zlib.compress(data, level)


def inflate(data: bytes, max_bytes: int = MAX_INFLATED_BYTES) -> bytes:
    """``zlib.decompress(data)``, refusing (ValueError) anything that inflates past
    ``max_bytes`` or does not end where the stream ends."""
    d = zlib.decompressobj()
    out = d.decompress(data, max_bytes)
    if d.unconsumed_tail:
        raise ValueError(f"compressed state inflates past {max_bytes:,} bytes; refused")
    if not d.eof:
        raise ValueError("compressed state is truncated")
    return out
