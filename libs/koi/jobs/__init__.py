"""Job specifications: online services and batch work, their arrivals and token lengths.

What users submit to Koi (``koi.jobs.submit.<user>``), as frozen dataclasses: ``OnlineJob``
(arrival process or trace, input/output length distributions, TTFT/TPOT SLO, priority)
and ``BatchJob`` (token volume and deadline); ``parse_job``/``load_jobs_yaml`` validate
the dict/YAML form with errors naming field and line; ``job_to_dict`` is the inverse.
Pure domain code: numpy, YAML and CSV reading only; it must not import transport
(nats, grpc, ``_pb2``) modules or read clocks or global randomness.
"""

from __future__ import annotations

from koi.jobs.arrival import ARRIVAL_KINDS, Arrival
from koi.jobs.lengths import LENGTH_KINDS, LengthDist, solve_lognormal
from koi.jobs.parse import job_to_dict, parse_job, parse_jobs
from koi.jobs.spec import BatchJob, JobSpec, OnlineJob, Slo
from koi.jobs.trace import Trace, load_trace, resolve_trace_path, shared_data_dir
from koi.jobs.yaml_io import load_job_yaml, load_jobs_yaml

__all__ = [
    "ARRIVAL_KINDS",
    "LENGTH_KINDS",
    "Arrival",
    "BatchJob",
    "JobSpec",
    "LengthDist",
    "OnlineJob",
    "Slo",
    "Trace",
    "job_to_dict",
    "load_job_yaml",
    "load_jobs_yaml",
    "load_trace",
    "parse_job",
    "parse_jobs",
    "resolve_trace_path",
    "shared_data_dir",
    "solve_lognormal",
]
