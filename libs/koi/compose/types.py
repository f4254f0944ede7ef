"""The composer's boundary types: what it is given each tick and the plan it returns.

Inputs are the evaluator's per-replica robust figures for every candidate
(``ScoredCandidate``, or the same in structure-of-arrays form as ``CandidateTable``),
each job's demand (``JobDemand``), free capacity per offering and the objective's
weights. The output is a ``ComposePlan``: one ``JobChoice`` per input job — placed,
deferred or rejected, always with a reason. Frozen dataclasses and numpy arrays only:
no solver code, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from koi.errors import InvalidSpecError
from koi.space import DeploymentConfig

DEFAULT_PRIORITY = 5
SECONDS_PER_HOUR = 3600.0


class JobKind(StrEnum):
    ONLINE = "online"
    BATCH = "batch"


class Decision(StrEnum):
    PLACE = "place"      # run it on the chosen candidate with ``replicas`` replicas
    DEFER = "defer"      # nothing this tick (no capacity, not worth its cost, no demand)
    REJECT = "reject"    # it cannot be served as asked (no configuration meets its SLO)


class SolverName(StrEnum):
    HIGHS_MILP = "highs-milp"
    GREEDY = "greedy"
    NONE = "none"        # nothing was placeable: no solve needed


@dataclass(frozen=True, slots=True)
class ScoredCandidate:
    """One candidate deployment for one job, with the evaluator's per-replica figures."""

    job_id: str
    candidate_id: str
    offering: str
    gpus_per_replica: int
    goodput_tok_s_per_replica: float   # robust SLO-meeting output tok/s of one replica
    usd_per_hour_per_replica: float
    max_rate_per_replica: float = 0.0  # robust req/s under SLO (online; 0 = unknown)
    slo_risk: float = 0.0              # 0..1: expected share of requests missing an SLO
    preemption_exposure: float = 0.0   # expected replica-hours lost per replica-hour
    is_current: bool = False           # the job's running config and offering
    migration_cost: float = 0.0        # churn penalty (objective units) for switching to it
    feasible_slo: bool = True          # can it meet the SLO at all?
    in_place: bool = False             # keeps the job's running deployment (see the table)
    config: DeploymentConfig | None = None
    label: str = ""                    # short name for reasons; '' = derived from config


@dataclass(frozen=True, eq=False)
class CandidateTable:
    """Candidates in structure-of-arrays form: row i of every array is candidate i."""

    job_id: np.ndarray            # object (str)
    candidate_id: np.ndarray      # object (str)
    offering: np.ndarray          # object (str)
    gpus_per_replica: np.ndarray  # int64, ≥ 1
    goodput_tok_s: np.ndarray     # float64, ≥ 0, per replica
    usd_per_hour: np.ndarray      # float64, ≥ 0, per replica
    max_rate_rps: np.ndarray      # float64, ≥ 0, per replica (0 = unknown)
    slo_risk: np.ndarray          # float64 in [0, 1]
    preemption_exposure: np.ndarray  # float64, ≥ 0
    is_current: np.ndarray        # bool
    migration_cost: np.ndarray    # float64, ≥ 0
    feasible_slo: np.ndarray      # bool
    configs: tuple[DeploymentConfig | None, ...] = ()   # () or one per row
    labels: tuple[str, ...] = ()                        # () or one per row
    # bool; empty (the default) = all False. True where the row keeps the job's running
    # deployment on its offering (it stays, scales or relaunches in place, on the GPUs it
    # holds). Any other row is a make-before-break move: the job keeps holding what it
    # holds now (``JobDemand.held_gpus``) until the new deployment serves.
    in_place: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __post_init__(self) -> None:
        n = len(self.job_id)
        if len(self.in_place) == 0:
            object.__setattr__(self, "in_place", np.zeros(n, dtype=bool))
        for name in ("candidate_id", "offering", "gpus_per_replica", "goodput_tok_s",
                     "usd_per_hour", "max_rate_rps", "slo_risk", "preemption_exposure",
                     "is_current", "migration_cost", "feasible_slo", "in_place"):
            if len(getattr(self, name)) != n:
                raise InvalidSpecError(f"candidates.{name}", f"has {len(getattr(self, name))}"
                                       f" rows, job_id has {n}")
        for name in ("configs", "labels"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise InvalidSpecError(f"candidates.{name}", f"must be empty or have {n} rows")
        _check_rows("gpus_per_replica", self.gpus_per_replica >= 1, "must be ≥ 1")
        for name in ("goodput_tok_s", "usd_per_hour", "max_rate_rps", "preemption_exposure",
                     "migration_cost"):
            arr = getattr(self, name)
            _check_rows(name, np.isfinite(arr) & (arr >= 0), "must be finite and ≥ 0")
        _check_rows("slo_risk", (self.slo_risk >= 0) & (self.slo_risk <= 1), "must be in 0..1")

    def __len__(self) -> int:
        return len(self.job_id)

    def label(self, i: int) -> str:
        """Short name of row ``i`` for reasons: 'h200 tp2 @ offering'."""
        name = self.labels[i] if self.labels and self.labels[i] else ""
        if not name:
            cfg = self.configs[i] if self.configs else None
            name = _config_label(cfg) if cfg is not None else str(self.candidate_id[i])
        return f"{name} @ {self.offering[i]}"

    @classmethod
    def from_candidates(cls, cands: Sequence[ScoredCandidate]) -> CandidateTable:
        def col(name: str, dtype: type | str) -> np.ndarray:
            return np.array([getattr(c, name) for c in cands], dtype=dtype)

        return cls(
            job_id=col("job_id", object), candidate_id=col("candidate_id", object),
            offering=col("offering", object), gpus_per_replica=col("gpus_per_replica", np.int64),
            goodput_tok_s=col("goodput_tok_s_per_replica", np.float64),
            usd_per_hour=col("usd_per_hour_per_replica", np.float64),
            max_rate_rps=col("max_rate_per_replica", np.float64),
            slo_risk=col("slo_risk", np.float64),
            preemption_exposure=col("preemption_exposure", np.float64),
            is_current=col("is_current", bool), migration_cost=col("migration_cost", np.float64),
            feasible_slo=col("feasible_slo", bool), in_place=col("in_place", bool),
            configs=tuple(c.config for c in cands), labels=tuple(c.label for c in cands))


def _check_rows(name: str, ok: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(~ok)
    if bad.size:
        raise InvalidSpecError(f"candidates[{int(bad[0])}].{name}", what)


def _config_label(cfg: DeploymentConfig) -> str:
    parts = [cfg.accelerator, f"tp{cfg.tp}"]
    if cfg.pp > 1:
        parts.append(f"pp{cfg.pp}")
    if cfg.dp_attention > 1:
        parts.append(f"dp{cfg.dp_attention}")
    if cfg.weight_precision != "bf16":
        parts.append(str(cfg.weight_precision))
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class JobDemand:
    """What one job needs this tick and what a served token of it is worth."""

    job_id: str
    kind: JobKind = JobKind.ONLINE
    priority: int = DEFAULT_PRIORITY          # 0..9; scales value (ComposeWeights.priority_step)
    demand_rate_rps: float = 0.0              # online: offered load, req/s
    output_tok_per_request: float = 0.0       # online: mean output tokens; 0 = from candidates
    required_tok_s: float = 0.0               # batch: remaining tokens / time to deadline
    ahead_tok_s: float = 0.0                  # batch: rate beyond required worth running
                                              # when capacity is spare (ComposeWeights.ahead)
    deadline_s: float = math.inf              # batch: seconds left to the deadline
    value_per_tok: float = 1e-4               # objective units per served token at priority 5
    min_replicas: int = 1                     # when placed: at least this many replicas
    max_replicas: int = 1024                  # when placed: at most this many
    currently_placed: bool = False
    best_infeasible_reason: str = ""          # evaluator's why-not when no candidate meets SLO
    # offering → GPUs the job's live deployments hold now (draining ones excluded). They
    # are at the plan's disposal: an in-place candidate reuses them, a move holds them
    # until it completes, and an unplaced job releases them (drained) unless
    # ``keeps_gpus_unplaced`` (an online job left serving as it is)
    held_gpus: Mapping[str, int] = field(default_factory=dict)
    keeps_gpus_unplaced: bool = False

    def __post_init__(self) -> None:
        where = f"jobs[{self.job_id}]"
        if not 0 <= self.priority <= 9:
            raise InvalidSpecError(f"{where}.priority", f"{self.priority} is not in 0..9")
        for name in ("demand_rate_rps", "output_tok_per_request", "required_tok_s",
                     "ahead_tok_s", "value_per_tok"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise InvalidSpecError(f"{where}.{name}", f"{v} must be finite and ≥ 0")
        for off, gpus in self.held_gpus.items():
            if gpus < 0:
                raise InvalidSpecError(f"{where}.held_gpus[{off}]", f"{gpus} must be ≥ 0")
        if self.min_replicas < 0 or self.max_replicas < max(self.min_replicas, 1):
            raise InvalidSpecError(f"{where}.max_replicas",
                                   f"need 0 ≤ min_replicas ≤ max_replicas and max ≥ 1"
                                   f" (got {self.min_replicas}..{self.max_replicas})")

    @classmethod
    def batch(cls, job_id: str, remaining_tokens: float, time_left_s: float,
              pace: float = 1.0, late_s: float = 0.0, **kw: object) -> JobDemand:
        """A batch job's demand: the rate that finishes ``remaining_tokens`` by the deadline.

        ``pace`` ≥ 1 offers up to ``pace`` × that rate, the part beyond it as ``ahead_tok_s``
        (worth ``ComposeWeights.ahead`` of a token at pace): work done ahead of the
        deadline's pace on capacity nothing else wants is work a later shortage cannot
        take away. A deadline already passed gives no demand at pace; with ``late_s`` > 0
        the remaining work is offered as ahead work at ``remaining_tokens / late_s``, so a
        late job is finished on spare capacity instead of crowding out jobs still on time.
        """
        if not (math.isfinite(pace) and pace >= 1):
            raise InvalidSpecError(f"jobs[{job_id}].pace", f"{pace} must be finite and ≥ 1")
        if time_left_s > 0:
            rate = remaining_tokens / time_left_s
            ahead = (pace - 1.0) * rate
        else:
            rate, ahead = 0.0, remaining_tokens / late_s if late_s > 0 else 0.0
        return cls(job_id=job_id, kind=JobKind.BATCH, required_tok_s=rate, ahead_tok_s=ahead,
                   deadline_s=time_left_s, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ComposeWeights:
    """Weights of the objective's terms (see ``koi.compose`` for the objective)."""

    cost: float = 1.0          # objective units per $ of GPU time
    risk: float = 1.0          # share of a token's value lost per unit of slo_risk
    churn: float = 1.0         # multiplies each candidate's migration_cost
    preemption: float = 1.0    # share of a replica's goodput lost per unit of exposure
    priority_step: float = 2.0  # a token of priority p is worth step**(p-5) of one at 5
    ahead: float = 0.1         # share of a token's value for batch work ahead of its pace
    # a move that changes a placed job's placement costs this many hours of the job's
    # demand value (value × demand; koi.planner.stability): on top of migration_cost
    move_value_h: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cost", "risk", "churn", "preemption", "ahead", "move_value_h"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise InvalidSpecError(f"weights.{name}", f"{v} must be finite and ≥ 0")
        if not (math.isfinite(self.priority_step) and self.priority_step >= 1):
            raise InvalidSpecError("weights.priority_step", "must be finite and ≥ 1")
        if self.ahead > 1:
            raise InvalidSpecError("weights.ahead", f"{self.ahead} must be ≤ 1 (work ahead of"
                                   " pace is worth no more than work at pace)")

    def priority_factor(self, priority: int) -> float:
        return float(self.priority_step ** (priority - DEFAULT_PRIORITY))


@dataclass(frozen=True, eq=False)
class ComposeInput:
    """One tick's composition problem."""

    jobs: Sequence[JobDemand]
    candidates: Sequence[ScoredCandidate] | CandidateTable
    # offering → free GPUs, not counting those the jobs hold (``JobDemand.held_gpus``)
    capacity: Mapping[str, int]
    weights: ComposeWeights = field(default_factory=ComposeWeights)
    # HiGHS stops at node_limit branch-and-bound nodes (a work limit: the same plan on any
    # machine under any load); the wall-clock limit is only a safety net
    node_limit: int = 2000
    time_limit_s: float = 5.0
    mip_rel_gap: float = 0.01          # HiGHS relative gap (on the loss, see koi.compose)
    top_k: int = 40                    # candidates kept per job before the MILP
    max_milp_candidates: int = 50_000  # above this (after pruning) use the greedy
    solver: str = "auto"               # auto | milp | greedy ("milp": no greedy fallback)

    def __post_init__(self) -> None:
        if self.solver not in ("auto", "milp", "greedy"):
            raise InvalidSpecError("solver", f"{self.solver!r} is not one of auto, milp, greedy")
        if self.top_k < 1:
            raise InvalidSpecError("top_k", "must be ≥ 1")
        if self.node_limit < 1:
            raise InvalidSpecError("node_limit", "must be ≥ 1")
        if not self.time_limit_s >= 0 or not 0 <= self.mip_rel_gap < 1:
            raise InvalidSpecError("time_limit_s", "need time_limit_s ≥ 0, 0 ≤ mip_rel_gap < 1")
        ids = [j.job_id for j in self.jobs]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise InvalidSpecError("jobs", f"job {dup!r} appears twice")
        for off, free in self.capacity.items():
            if free < 0:
                raise InvalidSpecError(f"capacity[{off}]", f"{free} free GPUs is negative")

    def table(self) -> CandidateTable:
        if isinstance(self.candidates, CandidateTable):
            return self.candidates
        return CandidateTable.from_candidates(list(self.candidates))


@dataclass(frozen=True, slots=True)
class JobChoice:
    """The composer's decision for one job, with the reason an operator reads."""

    job_id: str
    decision: Decision
    reason: str
    candidate_id: str | None = None
    offering: str = ""
    config: DeploymentConfig | None = None
    replicas: int = 0
    gpus: int = 0
    goodput_tok_s: float = 0.0      # expected served (SLO-meeting) output tok/s
    demand_tok_s: float = 0.0
    usd_per_hour: float = 0.0
    objective: float = 0.0          # this job's term of the objective, units per hour
    stays: bool = False             # placed on its current candidate


@dataclass(frozen=True, eq=False)
class ComposePlan:
    """Every input job's choice (in input order) and how the plan was found."""

    choices: tuple[JobChoice, ...]
    solver: SolverName
    status: str                     # e.g. "optimal", "time limit", why the fallback ran
    objective: float                # value − cost − risk − churn, objective units per hour
    objective_bound: float | None   # MILP upper bound on the objective (None for greedy)
    gap: float | None               # HiGHS relative gap on the loss (None for greedy)
    solve_s: float                  # whole compose() wall time
    milp_s: float                   # time inside HiGHS (0 if not run)
    candidates_in: int
    candidates_kept: int            # after feasibility, capacity and top-K pruning
    gpus_by_offering: dict[str, int]   # GPUs the plan occupies (moves count both ends)
    free_by_offering: dict[str, int]   # GPUs at its disposal: free + the jobs' held ones

    def choice(self, job_id: str) -> JobChoice:
        for c in self.choices:
            if c.job_id == job_id:
                return c
        raise KeyError(job_id)

    @property
    def goodput_tok_s(self) -> float:
        return sum(c.goodput_tok_s for c in self.choices)

    @property
    def usd_per_hour(self) -> float:
        return sum(c.usd_per_hour for c in self.choices)

    def count(self, decision: Decision) -> int:
        return sum(c.decision == decision for c in self.choices)
