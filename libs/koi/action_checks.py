"""What every fleet backend checks in a placing action before it acts on it.

A LAUNCH, SWAP or RELAUNCH carries a configuration and says where it goes (the action's
``offering`` or the configuration's own). The simulator (``koi.sim.actions``) and the
Kubernetes reconciler (``koi.fleet.k8s.reconcile``) refuse the same malformed actions
with the same words; this is the one place those words live. Pure: no fleet state.
"""

from __future__ import annotations

from koi.catalog import Catalog, Offering
from koi.cluster import Action
from koi.space import DeploymentConfig, validate


class ActionRefused(Exception):
    """An action that cannot be carried out; the message is the reason."""


def placed_config(a: Action, catalog: Catalog, model: str | None = None
                  ) -> tuple[DeploymentConfig, Offering]:
    """The action's configuration pinned to its offering, and that offering; raises
    ``ActionRefused`` when there is no configuration, it serves another model than
    ``model`` (when given), no offering is named or two disagree, or it is invalid."""
    cfg = a.config
    if cfg is None:
        raise ActionRefused(f"{a.kind.value} needs a config")
    if model is not None and cfg.model != model:
        raise ActionRefused(f"config serves {cfg.model}, but the job's model is {model}")
    off_id = a.offering or cfg.offering
    if not off_id:
        raise ActionRefused("no offering given (action.offering or config.offering)")
    if cfg.offering and a.offering and cfg.offering != a.offering:
        raise ActionRefused(f"action offering {a.offering} differs from config.offering"
                            f" {cfg.offering}")
    cfg = cfg.with_(offering=off_id)
    errors = validate(cfg, catalog)
    if errors:
        raise ActionRefused("invalid config: " + "; ".join(str(e) for e in errors))
    return cfg, catalog.offering(off_id)
