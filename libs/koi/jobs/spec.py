"""Job specifications: what a user asks Koi to serve.

An ``OnlineJob`` is a stream of requests (an ``Arrival`` with length distributions)
served under TTFT/TPOT SLOs; a ``BatchJob`` is a token volume due by a deadline. Both
are frozen and validate their own bounds (``InvalidSpecError`` naming the field); the
model id is checked against the catalog by the parser, not here. No YAML, no transport.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from koi.errors import InvalidSpecError
from koi.jobs import bounds as B
from koi.jobs._fields import check_bounds, meta, spec_field
from koi.jobs.arrival import Arrival
from koi.jobs.bounds import check_id
from koi.jobs.lengths import LengthDist, check_batch_tokens, check_request_tokens

JOB_KINDS = ("online", "batch")
DEFAULT_PRIORITY = 5


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives, met when the given percentile of requests is within both."""

    ttft_ms: float = field(metadata=meta("Time to first token objective, ms.",
                                         ge=B.MIN_TTFT_MS, le=B.MAX_TTFT_MS))
    tpot_ms: float = field(metadata=meta("Time per output token objective, ms.",
                                         ge=B.MIN_TPOT_MS, le=B.MAX_TPOT_MS))
    percentile: float = spec_field(95.0, "Share of requests (%) that must meet both.",
                                   gt=50, lt=100)

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True, slots=True)
class OnlineJob:
    """A latency-sensitive service: requests arrive over time and must meet the SLO."""

    id: str = field(metadata=meta("Unique job id: a DNS-1123 label (a-z, 0-9, '-'; <= 63)."))
    model: str = field(metadata=meta("Model id from the catalog."))
    arrival: Arrival = field(metadata=meta("How requests arrive."))
    input_len: LengthDist = field(metadata=meta("Prompt tokens per request."))
    output_len: LengthDist = field(metadata=meta("Generated tokens per request."))
    slo: Slo = field(metadata=meta("Latency objectives."))
    priority: int = spec_field(DEFAULT_PRIORITY, "0..9; higher is more important.", ge=0, le=9)
    prefix_share: float = spec_field(0.0, "Share of prompt tokens in a prefix shared across"
                                          " requests (cacheable).", ge=0, le=1)
    submit_s: float = spec_field(0.0, "When the job appears on the scenario clock, s.", ge=0,
                                 le=B.MAX_HORIZON_S)
    end_s: float | None = spec_field(None, "When it stops; None = runs to the horizon.", ge=0,
                                     le=B.MAX_HORIZON_S)
    client_region: str = spec_field("", "Where clients are (cloud/region); '' = anywhere.")
    pinned: bool = spec_field(False, "Never move it (no swap, no relaunch); it still scales.")
    max_moves_per_hour: float = spec_field(0.0, "Moves (swaps, relaunches, replica changes)"
                                                " it may make per hour; 0 = the fleet's"
                                                " KOI_CHURN_DEFAULT_MAX_MOVES_PER_HOUR.",
                                           ge=0, le=3600)

    def __post_init__(self) -> None:
        check_id(self.id)
        check_bounds(self)
        B.check_text("client_region", self.client_region)
        check_request_tokens(self.input_len, self.output_len)
        if self.end_s is not None and self.end_s <= self.submit_s:
            raise InvalidSpecError("end_s", f"must be > submit_s={self.submit_s:g}"
                                            f" (got {self.end_s:g})")

    @property
    def kind(self) -> str:
        return "online"

    def sample_requests(self, rng: np.random.Generator | None, start_s: float,
                        end_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times, input lengths, output lengths) of this job's requests in the window,
        clipped to the job's lifetime; a trace replays from ``submit_s``."""
        lo = max(start_s, self.submit_s)
        hi = end_s if self.end_s is None else min(end_s, self.end_s)
        if hi <= lo:
            empty = np.empty(0, dtype=np.int64)
            return np.empty(0, dtype=np.float64), empty, empty.copy()
        return self.arrival.sample_requests(rng, lo, hi, self.input_len, self.output_len,
                                            origin_s=self.submit_s)


@dataclass(frozen=True, slots=True)
class BatchJob:
    """Offline work: a number of requests whose tokens must all be processed by a deadline."""

    id: str = field(metadata=meta("Unique job id: a DNS-1123 label (a-z, 0-9, '-'; <= 63)."))
    model: str = field(metadata=meta("Model id from the catalog."))
    num_requests: int = field(metadata=meta("Requests in the batch (their tokens <= 1e16).",
                                            ge=1, le=10**12))
    input_len: LengthDist = field(metadata=meta("Prompt tokens per request."))
    output_len: LengthDist = field(metadata=meta("Generated tokens per request."))
    deadline_s: float = field(metadata=meta("Seconds after submit_s by which all must be done.",
                                            gt=0, le=B.MAX_HORIZON_S))
    submit_s: float = spec_field(0.0, "When the job appears on the scenario clock, s.", ge=0,
                                 le=B.MAX_HORIZON_S)
    priority: int = spec_field(DEFAULT_PRIORITY, "0..9; higher is more important.", ge=0, le=9)
    pinned: bool = spec_field(False, "Never move it (no swap, no relaunch); it still scales.")
    max_moves_per_hour: float = spec_field(0.0, "Moves (swaps, relaunches, replica changes)"
                                                " it may make per hour; 0 = the fleet's"
                                                " KOI_CHURN_DEFAULT_MAX_MOVES_PER_HOUR.",
                                           ge=0, le=3600)

    def __post_init__(self) -> None:
        check_id(self.id)
        check_bounds(self)
        check_request_tokens(self.input_len, self.output_len)
        check_batch_tokens(self.num_requests, self.input_len, self.output_len)

    @property
    def kind(self) -> str:
        return "batch"

    @property
    def due_s(self) -> float:
        """Absolute deadline on the scenario clock."""
        return self.submit_s + self.deadline_s

    @property
    def total_input_tokens(self) -> int:
        return round(self.num_requests * self.input_len.mean_value())

    @property
    def total_output_tokens(self) -> int:
        return round(self.num_requests * self.output_len.mean_value())

    @staticmethod
    def requests_for_tokens(total_output_tokens: int, output_len: LengthDist) -> int:
        """Requests needed for at least ``total_output_tokens`` at the mean output length."""
        return max(1, math.ceil(total_output_tokens / output_len.mean_value()))


JobSpec = OnlineJob | BatchJob
