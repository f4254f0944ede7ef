"""Efficiency factors: the predictor's small, documented calibration table.

The roofline is exact physics only at 100% efficiency; real kernels reach a fraction
of peak. Koi keeps that fraction as a product of a few factors, so that a factor
learned on one part transfers to the others:

    eff_mem  = mem[accelerator]  × engine_mem[engine]
    eff_comp = comp[accelerator] × precision_comp[precision] × engine_comp[engine]
    eff_link = link[interconnect]
    overhead = engine_ovh_base_ms (+ per-sequence engine_ovh_seq_us per pass)
    ttft    += engine_ttft_ms (request handling before the first pass)
    global   : attn_mem (paged-attention KV streaming vs weight streaming), moe_eff
               (grouped expert GEMMs vs dense GEMMs), serial_frac (how much of the
               shorter of memory and compute time fails to overlap the longer: the
               pass takes max(t_mem, t_comp) + serial_frac·min(t_mem, t_comp))

``PRIORS`` are engineering defaults (typical published MFU/MBU); ``data/calibration.yaml``
holds the values fitted on public measurements by ``koi.predictor.fit`` (never per
row). Factors absent from the file keep their prior. No prediction logic here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

CALIBRATION_FILE = Path(__file__).parent / "data" / "calibration.yaml"
# the table fitted with passes timed from the kernel tables where they cover a config
KERNELS_CALIBRATION_FILE = Path(__file__).parent / "data" / "calibration_kernels.yaml"

# Prior means (and the log-space spread the fit may move them by).
PRIORS: dict[str, dict[str, float]] = {
    "mem": {"_default": 0.75},
    "comp": {"_default": 0.55},
    "precision_comp": {"bf16": 1.0, "fp16": 1.0, "fp8": 0.8, "int8": 0.8, "int4": 0.85,
                       "fp4": 0.7},
    "engine_mem": {"vllm": 0.9, "sglang": 0.95, "trtllm": 1.0},
    "engine_comp": {"vllm": 0.9, "sglang": 0.95, "trtllm": 1.0},
    "engine_ovh_base_ms": {"vllm": 2.0, "sglang": 1.5, "trtllm": 1.0},
    "engine_ovh_seq_us": {"vllm": 10.0, "sglang": 8.0, "trtllm": 3.0},
    "engine_ttft_ms": {"vllm": 8.0, "sglang": 6.0, "trtllm": 5.0},
    "link": {"nvlink": 0.7, "pcie": 0.5, "infinity_fabric": 0.6, "roce": 0.5},
    # measured kernel time (tables.py) → a pass inside the engine, per engine: the tables
    # leave out norms, rotary embedding, activations, quantisation and launch gaps
    "kernel_scale": {"_default": 1.25},
    # structural constants shared by every part
    "global": {"attn_mem": 0.7, "moe_eff": 0.6, "serial_frac": 0.3},
}
GROUPS = tuple(PRIORS)
CEILING = 0.98  # no factor product may exceed this share of peak


@dataclass(frozen=True)
class Calibration:
    """Resolved factor table (priors overlaid with fitted values)."""

    factors: dict[str, dict[str, float]] = field(default_factory=dict)
    version: str = "prior"
    meta: dict[str, Any] = field(default_factory=dict)
    # the pass model the table was fitted for: True the kernel tables, False the
    # roofline, None not said (the predictor's default); ``build_inputs`` follows it
    kernels: bool | None = None

    def get(self, group: str, key: str) -> float:
        table = self.factors.get(group, {})
        if key in table:
            return table[key]
        prior = PRIORS[group]
        return prior.get(key, prior.get("_default", 1.0))

    def eff_mem(self, accelerator: str, engine: str) -> float:
        return min(CEILING, self.get("mem", accelerator) * self.get("engine_mem", engine))

    def eff_comp(self, accelerator: str, precision: str, engine: str) -> float:
        eff = (self.get("comp", accelerator) * self.get("precision_comp", precision)
               * self.get("engine_comp", engine))
        return min(CEILING, eff)

    def eff_link(self, interconnect: str) -> float:
        return min(CEILING, self.get("link", interconnect))

    def overhead_s(self, engine: str) -> tuple[float, float]:
        """(per-pass seconds, per-sequence seconds) of engine overhead."""
        return (self.get("engine_ovh_base_ms", engine) * 1e-3,
                self.get("engine_ovh_seq_us", engine) * 1e-6)

    def ttft_overhead_s(self, engine: str) -> float:
        return self.get("engine_ttft_ms", engine) * 1e-3

    def kernel_scale(self, engine: str) -> float:
        """Multiplier from the kernel tables' summed kernel time to the engine's pass."""
        return self.get("kernel_scale", engine)

    def global_(self, key: str) -> float:
        return self.get("global", key)

    def to_yaml_dict(self) -> dict[str, Any]:
        return {"version": self.version, "meta": self.meta, "factors": self.factors}


def prior_calibration() -> Calibration:
    return Calibration(factors={g: {} for g in GROUPS}, version="prior")


def calibration_from_dict(data: dict[str, Any]) -> Calibration:
    factors = data.get("factors", {}) or {}
    unknown = set(factors) - set(GROUPS)
    if unknown:
        raise ValueError(f"calibration: unknown factor groups {sorted(unknown)}")
    clean = {g: {str(k): float(v) for k, v in (factors.get(g) or {}).items()} for g in GROUPS}
    for group, table in clean.items():
        for key, value in table.items():
            if not value > 0:
                raise ValueError(f"calibration: {group}.{key} must be > 0 (got {value})")
    return Calibration(factors=clean, version=str(data.get("version", "fitted")),
                       meta=dict(data.get("meta", {}) or {}))


def calibration_file(kernels: bool | None = None) -> Path:
    """The fitted table's file for the roofline or the kernel-table predictor (None: the
    predictor's default, ``tables.DEFAULT``)."""
    from koi.predictor.tables import DEFAULT

    use = DEFAULT if kernels is None else kernels
    return KERNELS_CALIBRATION_FILE if use else CALIBRATION_FILE


def load_calibration(path: Path | None = None, kernels: bool | None = None) -> Calibration:
    """The fitted table (or the priors when no file has been fitted yet): ``path``, else
    the one fitted for the kernel-table or roofline predictor (``calibration_file``),
    marked with the pass model it is for (``Calibration.kernels``)."""
    if path is not None:
        return _load(path, None)
    from koi.predictor.tables import DEFAULT

    use = DEFAULT if kernels is None else kernels
    return _load(calibration_file(use), use)


@lru_cache(maxsize=4)
def _load(target: Path, kernels: bool | None) -> Calibration:
    if not target.exists():
        return replace(prior_calibration(), kernels=kernels)
    with target.open() as fh:
        return replace(calibration_from_dict(yaml.safe_load(fh) or {}), kernels=kernels)
