"""The practitioner policies Koi is compared with, registered by importing their modules.

What teams run when they do not have Koi: a contextual bandit over configs (``bandit``),
an evolutionary plan search scored from per-replica profiles (``evolve``), a cost-minimal GPU mix
by ILP from offline profiles (``melange-ilp``) and a latency-regression autoscaler on a
fixed config (``regress-autoscale``). Each plans from a profile measured in the run's
world first, as its users profile their GPUs (``profiled``); ``<name>-unprofiled`` plans
from the predictor instead. Each lives in its own module, with both variants; shared
helpers are in ``profiles`` and ``reconcile``. This module holds no logic.
"""

from __future__ import annotations

from koi.policies import autoscale, bandit, evolve, melange  # noqa: F401
