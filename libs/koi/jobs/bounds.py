"""Physical bounds on every field a job may be admitted with, and the id and text checks.

A job that passes validation must be one a fleet could serve and the simulator can run:
no bound here is a preference, each is the most any catalog fleet could do, with room to
spare. The constants are read by the field metadata of the job dataclasses (so the YAML
and protobuf paths, which both build those dataclasses, enforce them in one place) and by
``check_job``, the cross-field checks every job runs at construction. docs/JOBS.md
("Bounds") lists them; the token checks that read them sit beside the length
distributions they measure (``koi.jobs.lengths``). Pure: no I/O, no catalog loading
(tests tie the numbers to the catalog).
"""

from __future__ import annotations

import re

from koi.errors import InvalidSpecError

DAY_S = 86_400.0

# Job ids are DNS-1123 labels: they become NATS subject tokens, file names and, with a
# Kubernetes backend, resource names; CR/LF or 10,000 characters in one forged log lines.
MAX_ID_LEN = 63
ID_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

# The longest a run (and so any time on a job) can reach: 30 days. Scenarios run hours;
# a month covers any planning horizon while keeping tick counts finite.
MAX_HORIZON_S = 30 * DAY_S

# Requests per second of one online job (rate, diurnal mean, replayed trace mean). The
# best measured rate in perf_measurements.csv is 231 req/s per GPU (llama-3.1-8b, H200,
# 128/128 tokens, max-throughput batching); online SLOs leave about a tenth of that, so
# 10,000 req/s is a job that fills the largest shipped fleet (400 GPUs) on the smallest
# model. It also caps what the simulator materialises: ≤ 600,000 requests per 60 s tick.
MAX_RATE_RPS = 10_000.0

# Tokens of one request (prompt + output). The largest context in the catalog is 163,840
# (deepseek-v3); 2^18 leaves room for public traces (the Mooncake synthetic trace has
# 191k-token prompts) and covers the default clip bounds (131,072 each way).
MAX_REQUEST_TOKENS = 262_144

# Tokens (prompt + output) of one batch job. The catalog's compute ceiling is ~1.4e6
# tokens/s per GPU (b200 at 9,000 fp4 TFLOP/s on the 3.3B active parameters of
# qwen3-30b-a3b, 2 FLOP per parameter per token, 100 % utilisation); the largest shipped
# fleet (400 GPUs) at that ceiling for MAX_HORIZON_S processes 1.4e15 tokens.
MAX_BATCH_TOKENS = 1e16

# SLO floors: no engine returns a first token in under a millisecond, or an output token
# in under 0.1 ms (a decode step of the smallest model on the fastest GPU takes several
# ms). Ceilings: a TTFT beyond an hour or a TPOT beyond a minute is not a latency goal.
MIN_TTFT_MS, MAX_TTFT_MS = 1.0, 3_600_000.0
MIN_TPOT_MS, MAX_TPOT_MS = 0.1, 60_000.0

# A replayed trace: at most a million rows (50x the largest shipped trace, 19,366 rows in
# 404 KB) in at most 64 MiB, replayed at most 1,000x faster or slower than recorded.
# Empirical length lists share the row bound.
MAX_TRACE_ROWS = 1_000_000
MAX_TRACE_BYTES = 64 * 1024 * 1024
MIN_TIME_SCALE, MAX_TIME_SCALE = 1e-3, 1e3
MAX_EMPIRICAL_VALUES = MAX_TRACE_ROWS

# A job YAML file: the biggest shipped scenario is ~20 KB, so 1 MiB holds thousands of
# jobs (~7,000 one-line jobs, ~150,000 YAML nodes); aliases may not expand a document past
# 250,000 nodes (a 443-byte alias bomb expands to 600,000 and took minutes to walk).
MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_NODES = 250_000

# Free text carried with a job (client_region): a cloud/region name.
MAX_TEXT_LEN = 128


def check_id(job_id: object) -> None:
    """Raise unless ``job_id`` is a DNS-1123 label (lower-case letters, digits, '-';
    starts and ends alphanumeric; at most 63 characters). The error never echoes more
    than a short, printable prefix of the id."""
    if not isinstance(job_id, str) or not job_id:
        raise InvalidSpecError("id", "must be a non-empty string")
    if len(job_id) > MAX_ID_LEN:
        raise InvalidSpecError("id", f"must be at most {MAX_ID_LEN} characters"
                                     f" (got {len(job_id)})")
    if not ID_PATTERN.fullmatch(job_id):
        raise InvalidSpecError("id", f"{job_id.encode('unicode_escape').decode()[:80]!r} must"
                                     " be a DNS-1123 label: lower-case letters, digits and"
                                     " '-', starting and ending with a letter or digit")


def check_text(field: str, value: str) -> None:
    """Short printable text only: no control characters, at most ``MAX_TEXT_LEN``."""
    if len(value) > MAX_TEXT_LEN:
        raise InvalidSpecError(field, f"must be at most {MAX_TEXT_LEN} characters"
                                      f" (got {len(value)})")
    if not value.isprintable():
        raise InvalidSpecError(field, "must not hold control characters")
