"""Planning policies behind one interface (``base.Policy``), listed by name in
``registry``."""

from koi.policies.base import Policy, register
from koi.policies.registry import (
    default_policy_names,
    make_policy,
    model_endpoint_problem,
    policy_class,
    policy_names,
)

__all__ = ["Policy", "default_policy_names", "make_policy", "model_endpoint_problem",
           "policy_class", "policy_names", "register"]
