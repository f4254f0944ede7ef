"""Planning policies behind one interface (``base.Policy``) and a registry."""

from koi.policies.base import (
    REGISTRY,
    Policy,
    default_policy_names,
    make_policy,
    model_endpoint_problem,
    policy_names,
    register,
)

__all__ = ["REGISTRY", "Policy", "default_policy_names", "make_policy",
           "model_endpoint_problem", "policy_names", "register"]
