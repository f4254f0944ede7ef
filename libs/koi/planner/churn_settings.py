"""The fleet's churn settings (``KOI_CHURN_*``): one pydantic model, every field with a
default, a description and its bounds; what the holds do is ``koi.planner.stability``.
Kept apart so the services' variable list can read it without importing the planner.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENV_PREFIX = "KOI_CHURN_"


class ChurnSettings(BaseModel):
    """The fleet's churn settings. Defaults chosen on development seeds (generated medium
    1-6 and hetero-3h s1; ``git show def7e56:docs/history/ISSUE30-rate-2026-12-04.md``
    and ISSUE30-flaps-2026-12-04.md beside it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    make_before_break: bool = Field(
        True, description="An online job changes shape on its offering make-before-break "
        "(a swap there), relaunching in place only where both ends can never fit.")
    scale_down_window_s: float = Field(
        600.0, ge=0.0, le=86_400.0, description="A job keeps the highest replica count "
        "planned for its placement over this window (0: scale down at once). At least the "
        "flap window (10 min), so a scale-down never follows a scale-up within it.")
    scale_down_band: int = Field(
        1, ge=0, le=16, description="Replicas a scale-down must clear: a job scales down "
        "only when the most planned over the window is more than this many below what it "
        "runs, and then to that most plus this many (0: to the most planned).")
    scale_down_gap_s: float = Field(
        600.0, ge=0.0, le=86_400.0, description="A job scales down only when its last move "
        "(of any kind) is at least this long ago, so a falling count steps down once, not "
        "a replica a tick as the window slides (0: off).")
    scale_down_yield: bool = Field(
        False, description="A held scale-down gives back the GPUs the plan's growth on its "
        "offering needs beyond the free ones (off: on development seeds it kept a new job "
        "from waiting but undid most of the holds, flaps 14 -> 107).")
    scale_down_yield_new: bool = Field(
        False, description="A held scale-down gives back the GPUs that jobs holding none "
        "(a launch, a job whose offering stocked out) were planned on its offering beyond "
        "the free ones, and no more (off: on development seeds a partial give-back left "
        "the newcomer still waiting and the GPUs idle, and the held job took them back the "
        "next tick: flaps 2 -> 21 on four runs).")
    scale_down_headroom: float = Field(
        0.25, ge=0.0, le=1.0, description="A scale-down keeps this share above the most "
        "planned over the window (rounded up), so a count that falls and rises back "
        "within the flap window is not taken down and up again (0: off; the band alone).")
    scale_down_rising_hold: bool = Field(
        True, description="An online job does not scale down while its rate over the "
        "last rate_rise_s is above its mean over rate_window_s (demand rising: the lower "
        "count would be undone within minutes).")
    scale_down_short_hold: bool = Field(
        False, description="A job whose plan serves less than its demand keeps what it "
        "runs rather than scale down (the composer gave its GPUs to others; its demand "
        "did not fall), but for what jobs holding no GPUs need (scale_down_yield_new).")
    scale_up_after_down_confirm: int = Field(
        0, ge=0, le=30, description="Plans in a row that must ask for more replicas "
        "before a scale-up within scale_down_gap_s of the job's last scale-down, in "
        "place of scale_up_confirm (0: scale_up_confirm), unless the plan asks for more "
        "than the job ran before that scale-down; only with a scale-down window.")
    scale_up_margin: float = Field(
        0.0, ge=0.0, le=1.0, description="A scale-up goes this share beyond the count "
        "planned (rounded down: no extra replica below 1/margin), and the scale-down band "
        "widens to the same share of the most planned, so a count that keeps creeping up "
        "(a batch job falling behind its pace) is not raised one replica a tick (0: off).")
    scale_up_confirm: int = Field(
        2, ge=1, le=10, description="Plans in a row for the same placement that must ask "
        "for more replicas than run before a scale-up, which goes to the fewest they asked "
        "for (1: at once). A plan that asks for a new placement is not held.")
    rate_window_s: float = Field(
        600.0, ge=0.0, le=86_400.0, description="An online job is planned for the mean of "
        "its observed rates over this window, or over the last rate_rise_s where that is "
        "higher: a rise is planned for at once, a fall only once the window has seen it "
        "(0: the last tick's rate alone, noisy by the thinned samples it counts).")
    rate_rise_s: float = Field(
        120.0, ge=0.0, le=86_400.0, description="The recent stretch whose mean rate, when "
        "above the window's, is planned for instead (0: the last tick's rate alone).")
    cooldown_s: float = Field(
        900.0, ge=0.0, le=86_400.0, description="A job placed (launched, swapped or "
        "relaunched) less than this long ago keeps its placement (it may still scale), "
        "while a configuration it runs still meets its SLO robustly on an offering that "
        "has GPUs.")
    move_value_h: float = Field(
        0.05, ge=0.0, le=10.0, description="A move that changes a running job's placement "
        "costs this many hours of the job's demand value in the composer's objective.")
    uncertainty_z: float = Field(
        0.0, ge=0.0, le=5.0, description="A running job's options are valued at their "
        "capacity × exp(−z·sd), sd the posterior spread of the pass belief their scope "
        "reads (widened by the prior's when it is backed off from a broader scope), so a "
        "move must beat the tried configuration by more than its estimate's uncertainty "
        "(0: off).")
    default_max_moves_per_hour: float = Field(
        0.0, ge=0.0, le=3600.0, description="Moves per hour a job may make when its spec "
        "sets no max_moves_per_hour (0: no limit).")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChurnSettings:
        """Defaults overridden by ``KOI_CHURN_<FIELD>``; a bad value raises ValueError
        naming the variable."""
        env = os.environ if environ is None else environ
        given = {name: env[ENV_PREFIX + name.upper()] for name in cls.model_fields
                 if ENV_PREFIX + name.upper() in env}
        try:
            return cls.model_validate(given)
        except ValidationError as err:
            bad = "; ".join(f"{ENV_PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}"
                            for e in err.errors(include_input=False, include_url=False))
            raise ValueError(bad) from None

    @classmethod
    def env_table(cls) -> dict[str, tuple[str, str]]:
        """``KOI_CHURN_*`` name → (default as the environment spells it, meaning): the
        services' one list of variables takes these from here."""
        return {ENV_PREFIX + name.upper(): (str(f.default).lower() if isinstance(f.default, bool)
                                            else f"{f.default:g}", f.description or "")
                for name, f in cls.model_fields.items()}

    @classmethod
    def off(cls) -> ChurnSettings:
        """Every hold off: the planner as it was before plan stability."""
        return cls(make_before_break=False, scale_down_window_s=0.0, scale_down_band=0,
                   scale_down_gap_s=0.0, scale_down_yield=False, scale_down_yield_new=False,
                   scale_down_headroom=0.0, scale_down_rising_hold=False,
                   scale_down_short_hold=False,
                   scale_up_after_down_confirm=0, scale_up_margin=0.0,
                   scale_up_confirm=1, rate_window_s=0.0, rate_rise_s=0.0, cooldown_s=0.0,
                   move_value_h=0.0, uncertainty_z=0.0, default_max_moves_per_hour=0.0)


__all__ = ["ENV_PREFIX", "ChurnSettings"]
