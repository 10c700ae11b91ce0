"""RoPE frequency tables: the inverse frequencies θ_i of the rotated planes, and the factor that
multiplies cos and sin, for the scaling types checkpoints use.

Every type starts from the default table over the R rotated coordinates of a head (R = d_head,
or ``rotary_dim`` for a partial rotary)::

    θ_i = base^(−2i/R),  i = 0 … R/2 − 1

and the angle of plane i at position p is p·θ_i.  The scalings (as in transformers'
``modeling_rope_utils``, evaluated here in float64):

* ``linear``:   θ_i / factor  (positions interpolated by the factor).
* ``dynamic``:  NTK-aware: base' = base·(factor·L/L₀ − (factor − 1))^(R/(R−2)) with L = max(n, L₀),
  L₀ = ``max_position_embeddings`` — the table depends on the input length n, fixed within one
  forward (n ≤ L₀: the default table).
* ``yarn``:     per plane a blend of θ_i (extrapolation) and θ_i/factor (interpolation) by a linear
  ramp over the planes between the correction dimensions of β_fast and β_slow rotations in the
  original context; cos and sin multiplied by the attention factor (default 0.1·ln(factor) + 1).
* ``llama3``:   θ_i kept for wavelengths below L_orig/high_freq_factor, divided by the factor above
  L_orig/low_freq_factor, smoothly interpolated between.
* ``longrope``: θ_i / f_i with the per-plane ``short_factor`` (n ≤ L_orig) or ``long_factor``
  (n > L_orig); cos and sin multiplied by the attention factor (default √(1 + ln s/ln L_orig)).

The gauge group does not see which table is used: any table of distinct frequencies has the same
commutant (per plane a·I + b·J); the scaling only changes the angles and a common factor of the scores.
"""

from __future__ import annotations

import math
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
# The options each type reads (required ones first; defaults where transformers has them).
_OPTIONS: dict[str, dict[str, Any]] = {  # option → default (None: required)
    "default": {},
    "linear": {"factor": None},
    "dynamic": {"factor": None},
    "yarn": {
        "factor": None,
        "original_max_position_embeddings": None,
        "attention_factor": 0.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 0.0,
        "mscale_all_dim": 0.0,
        "truncate": 1.0,
    },
    "llama3": {
        "factor": None,
        "low_freq_factor": None,
        "high_freq_factor": None,
        "original_max_position_embeddings": None,
    },
    "longrope": {
        "short_factor": None,
        "long_factor": None,
        "original_max_position_embeddings": None,
        "factor": 0.0,
        "attention_factor": 0.0,
    },
}


def scaling_problem(rope_type: str, params: tuple, rotary_dim: int) -> str | None:
    """None, or why a (type, options) pair is not a valid frequency table for R = rotary_dim."""
    if rope_type not in ROPE_TYPES:
        return f"rope_type must be one of {', '.join(ROPE_TYPES)}"
    got: dict[str, Any] = dict(params)
    allowed = _OPTIONS[rope_type]
    extra = sorted(set(got) - set(allowed))
    if extra:
        return f"rope_type {rope_type} takes no option(s) {', '.join(extra)}"
    missing = sorted(k for k, v in allowed.items() if v is None and k not in got)
    if missing:
        return f"rope_type {rope_type} needs {', '.join(missing)}"
    for k, v in got.items():
        if k in ("short_factor", "long_factor"):
            if not (isinstance(v, tuple) and len(v) == rotary_dim // 2 and all(x > 0 for x in v)):
                return f"{k} must be {rotary_dim // 2} positive numbers (one per rotated plane)"
        elif not (isinstance(v, float) and math.isfinite(v) and v >= 0):
            return f"{k} must be a finite non-negative number"
    if rope_type in ("linear", "dynamic", "yarn", "llama3") and not got["factor"] > 0:
        return "factor must be > 0"
    if rope_type == "llama3" and not got["high_freq_factor"] > got["low_freq_factor"] > 0:
        return "llama3 needs high_freq_factor > low_freq_factor > 0"
    if rope_type in ("yarn", "llama3", "longrope") and not got["original_max_position_embeddings"] >= 1:
        return "original_max_position_embeddings must be >= 1"
    if rope_type == "dynamic" and rotary_dim <= 2:
        return "dynamic NTK scaling needs at least two rotated planes"
    return None


def _option(cfg, key: str) -> float:
    got: dict[str, Any] = dict(cfg.rope_params)
    return got[key] if key in got else _OPTIONS[cfg.rope_type][key]


def _yarn(cfg, R: int, base: float, theta: torch.Tensor) -> tuple[torch.Tensor, float]:
    factor, orig = _option(cfg, "factor"), _option(cfg, "original_max_position_embeddings")

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    af, m, m_all = _option(cfg, "attention_factor"), _option(cfg, "mscale"), _option(cfg, "mscale_all_dim")
    if not af:
        af = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)

    def correction_dim(rotations: float) -> float:  # the plane index that turns `rotations` times in L_orig
        return R * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(_option(cfg, "beta_fast")), correction_dim(_option(cfg, "beta_slow"))
    if _option(cfg, "truncate"):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, R - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(R // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep θ_i (fast planes), 0: θ_i / factor (slow planes)
    return theta / factor * (1 - extrapolate) + theta * extrapolate, af


def _llama3(cfg, theta: torch.Tensor) -> torch.Tensor:
    factor, lo, hi = _option(cfg, "factor"), _option(cfg, "low_freq_factor"), _option(cfg, "high_freq_factor")
    orig = _option(cfg, "original_max_position_embeddings")
    wavelen = 2 * math.pi / theta
    scaled = torch.where(wavelen > orig / lo, theta / factor, theta)
    smooth = (orig / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / hi) & (wavelen <= orig / lo)
    return torch.where(medium, blended, scaled)


def inverse_frequencies(cfg, n: int) -> tuple[torch.Tensor, float]:
    """(θ_i for i < R/2 as float64, the cos/sin factor) for inputs of n positions."""
    R, base = cfg.rotary_dim or cfg.d_head, cfg.rope_base
    exponent = torch.arange(0, R, 2, dtype=torch.float64) / R
    kind = cfg.rope_type
    if kind == "dynamic":
        L0, factor = cfg.n_ctx, _option(cfg, "factor")
        L = max(n, L0)
        base = base * (factor * L / L0 - (factor - 1)) ** (R / (R - 2))
    theta = 1.0 / base**exponent
    if kind == "linear":
        return theta / _option(cfg, "factor"), 1.0
    if kind == "yarn":
        return _yarn(cfg, R, base, theta)
    if kind == "llama3":
        return _llama3(cfg, theta), 1.0
    if kind == "longrope":
        orig = _option(cfg, "original_max_position_embeddings")
        f = torch.tensor(_option(cfg, "long_factor" if n > orig else "short_factor"), dtype=torch.float64)
        s = _option(cfg, "factor") or cfg.n_ctx / orig
        af = _option(cfg, "attention_factor") or (1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(orig)))
        return theta / f, af
    return theta, 1.0
