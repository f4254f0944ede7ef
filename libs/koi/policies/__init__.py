"""Planning policies behind one interface (``base.Policy``) and a registry."""

from koi.policies.base import REGISTRY, Policy, make_policy, policy_names, register

__all__ = ["REGISTRY", "Policy", "make_policy", "policy_names", "register"]
