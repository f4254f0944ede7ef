"""Where each job and deployment is in its life, read off a ``ClusterSnapshot``.

Is a job finished (a batch job's requests all done, an online job past its end), how
much batch work is left, which deployments hold GPUs and which lost every replica. The
planner, the baselines and the metrics share these so that "finished" and "lost" mean
the same thing everywhere. Pure functions over ``koi.cluster`` types: no decisions, no
clocks or randomness (time comes from the snapshot or the caller).
"""

from __future__ import annotations

from koi.cluster import ClusterSnapshot, Deployment, DeploymentState, JobStatus
from koi.jobs import BatchJob, OnlineJob


def live_deployments(snapshot: ClusterSnapshot, job_id: str) -> list[Deployment]:
    """The job's deployments that hold or will hold GPUs (anything but stopped)."""
    return [d for d in snapshot.deployments_of(job_id) if d.state != DeploymentState.STOPPED]


def is_lost(dep: Deployment) -> bool:
    """A starting/running deployment with no replica left (preempted or stocked out)."""
    active = dep.state in (DeploymentState.STARTING, DeploymentState.RUNNING)
    return active and dep.replicas_ready + dep.replicas_starting == 0


def batch_done(job: JobStatus) -> bool:
    """A batch job all of whose requests have finished (``JobStatus.requests_done``).

    Not "its output tokens reached the spec's total": that total is the expected one
    (requests × mean output length), and the sampled outputs land a few percent either
    side of it. Below it, a job judged by tokens never finished and kept its replicas
    idle after its last request (hetero-12h seed 4: 680-2,000 GPU-hours; NOTES); above
    it, requests were left unserved.
    """
    spec = job.spec
    return isinstance(spec, BatchJob) and job.requests_done >= spec.num_requests - 1e-6


def batch_tokens_left(job: JobStatus) -> float:
    """Output tokens a batch job still has to produce, expected: its unfinished requests
    × the mean output length (0 when done, and for online jobs)."""
    spec = job.spec
    if not isinstance(spec, BatchJob):
        return 0.0
    return max(spec.num_requests - job.requests_done, 0.0) * spec.output_len.mean_value()


def online_ended(job: JobStatus, now_s: float) -> bool:
    """An online job past its ``end_s``: no more requests will arrive."""
    spec = job.spec
    return isinstance(spec, OnlineJob) and spec.end_s is not None and now_s >= spec.end_s


def job_finished(job: JobStatus, now_s: float) -> bool:
    return batch_done(job) or online_ended(job, now_s)


def job_rate_rps(job: JobStatus) -> float:
    """The declared mean request rate of an online job (0 for batch)."""
    spec = job.spec
    return spec.arrival.mean_rate() if isinstance(spec, OnlineJob) else 0.0
