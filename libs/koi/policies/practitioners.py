"""The practitioner policies Koi is compared with, registered by importing their modules.

What teams run when they do not have Koi: a contextual bandit over configs (``bandit``),
an evolutionary plan search scored by the predictor (``evolve``), a cost-minimal GPU mix
by ILP from offline profiles (``melange-ilp``) and a latency-regression autoscaler on a
fixed config (``regress-autoscale``). Each lives in its own module; shared helpers are in
``practitioner_common``. This module holds no logic.
"""

from __future__ import annotations

from koi.policies import autoscale, bandit, evolve, melange  # noqa: F401
