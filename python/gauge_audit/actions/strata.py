"""Special points: where a false contrast's obstruction vanishes and the contrast really holds.

A false contrast fails *generically*: its proof of failure names an obstruction — a reader that
sees n(x)·R·D_γ·Rᵀ instead of n(x)·D_γ, a score q·M·Mᵀ·kᵀ instead of q·kᵀ, gelu(s·z)/s instead of
gelu(z) — that is non-zero for generic weights.  On a stratum of measure zero it vanishes: all
entries of a norm weight equal (D_γ then commutes with every rotation), a head whose scores no
output depends on, a hidden unit that contributes nothing.  A freshly initialised checkpoint sits
on such strata (norm weights exactly 1, biases 0), and there the contrast's rule is exactly
function-preserving: the check must predict HOLDS and say why, not report a contradiction.

Each contrast's special-point test (next to the action, in its own module) is derived from that
obstruction; these are the measures they share.  Tolerances:

* *equal entries* — a vector whose entries agree to within ε·max|t| (ε of the dtype the check
  computes in) differs from a constant vector by less than one rounding of that dtype, which
  the check's tolerance already allows for every operation; a larger spread is a point off the
  stratum, where the generic prediction stands;
* *zero* — exact: pruned or dead units are stored as zeros, and a weight of any non-zero size
  feeds the output at a size only the rest of the network could put in proportion.

Only sufficient conditions are tested (each makes the rule exact at every group element), so a
point is called special only when the rule provably holds there; a contrast that holds at a
point none of them covers is still reported as differing from the theory.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..models.config import Config
from ..models.layers import rope_planes
from .base import as64


def spread(t: torch.Tensor) -> float:
    """(max − min)/max|t| of the entries (0 for a zero or one-entry vector): how far from ∝ 1."""
    t = as64(t).flatten()
    scale = float(t.abs().max()) if t.numel() else 0.0
    return 0.0 if scale == 0.0 else float(t.max() - t.min()) / scale


def offset_spread(t: torch.Tensor, scale: float) -> float:
    """(max − min) of the entries relative to ``scale`` (a shift β next to the weight γ it is added to)."""
    t = as64(t).flatten()
    width = float(t.max() - t.min()) if t.numel() else 0.0
    return 0.0 if width == 0.0 else (float("inf") if scale == 0.0 else width / scale)


def zero(params: Mapping, name: str) -> bool:
    """The tensor is absent or exactly zero."""
    return name not in params or not bool(params[name].any())


def _rows_zero(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    return ~(t != 0).any(dim=dims) if t.numel() else torch.ones(t.shape[:1], dtype=torch.bool)


def heads_ignored(cfg: Config, params: Mapping, layer: int) -> torch.Tensor:
    """(n_heads,) bool: the head's output does not depend on its attention pattern — W_O[h] = 0,
    or the values of its KV head are constant (W_V[j] = 0: A·1·b_V = b_V since rows of A sum to 1)."""
    pre = f"blocks.{layer}.attn"
    dead_o = _rows_zero(params[f"{pre}.W_O"], (1, 2))
    const_v = _rows_zero(params[f"{pre}.W_V"], (1, 2)).repeat_interleave(cfg.group_size)
    return dead_o | const_v


def _bias_rows_zero(params: Mapping, name: str, rows: int) -> torch.Tensor:
    if name not in params:
        return torch.ones(rows, dtype=torch.bool)
    return _rows_zero(params[name], (1,))


def queries_zero(cfg: Config, params: Mapping, layer: int) -> torch.Tensor:
    """(n_heads,) bool: every query of the head is 0 (W_Q[h] = 0 and b_Q[h] = 0): all its scores are 0."""
    pre = f"blocks.{layer}.attn"
    return _rows_zero(params[f"{pre}.W_Q"], (1, 2)) & _bias_rows_zero(params, f"{pre}.b_Q", cfg.n_heads)


def keys_constant(cfg: Config, params: Mapping, layer: int) -> torch.Tensor:
    """(n_heads,) bool (per query head): the keys it sees are the same at every position — W_K[j] = 0,
    and b_K[j] = 0 under RoPE (which rotates a constant key by its position).  A score q·S·kᵀ is
    then constant over the keys of a query, which softmax ignores."""
    pre = f"blocks.{layer}.attn"
    const = _rows_zero(params[f"{pre}.W_K"], (1, 2))
    if cfg.pos == "rope":
        const = const & _bias_rows_zero(params, f"{pre}.b_K", cfg.n_kv_heads)
    return const.repeat_interleave(cfg.group_size)


def plane_support(cfg: Config, params: Mapping, layer: int, kind: str) -> torch.Tensor:
    """(heads, planes) bool: the query (kind "Q") or key ("K") of the head has a non-zero weight or
    bias in that RoPE frequency plane."""
    pre = f"blocks.{layer}.attn"
    w = params[f"{pre}.W_{kind}"] != 0
    b = params[f"{pre}.b_{kind}"] != 0 if f"{pre}.b_{kind}" in params else None
    cols = []
    for i, j in rope_planes(cfg):
        c = w[..., [i, j]].any(dim=(1, 2))
        if b is not None:
            c = c | b[..., [i, j]].any(dim=1)
        cols.append(c)
    return torch.stack(cols, dim=1)


def ffn_prefix(cfg: Config, layer: int) -> str:
    return f"blocks.{layer}.{'moe' if cfg.experts else 'mlp'}"


def units_silent(cfg: Config, params: Mapping, layer: int) -> torch.Tensor:
    """(…, d_ff) bool per hidden unit (per expert in MoE): the unit adds nothing to the output —
    its row of W_out is 0, or its pre-activation is identically 0 (column of W_in = 0, bias 0) and
    the activation vanishes at 0 (relu, gelu, silu; SwiGLU: the up or the gate projection 0)."""
    pre = ffn_prefix(cfg, layer)
    silent = _rows_zero(params[f"{pre}.W_out"].transpose(-1, -2), (-2,))

    def input_zero(w: str, b: str) -> torch.Tensor:
        z = ~(params[f"{pre}.{w}"] != 0).any(dim=-2)
        if f"{pre}.{b}" in params:
            z = z & (params[f"{pre}.{b}"] == 0)
        return z

    silent = silent | input_zero("W_in", "b_in")
    if cfg.act == "swiglu":
        silent = silent | input_zero("W_gate", "b_gate")
    return silent


def units_constant(cfg: Config, params: Mapping, layer: int) -> torch.Tensor:
    """(…, d_ff) bool: the unit's contribution does not depend on the FFN's input (silent, or every
    input column of it 0: a constant act(b))."""
    pre = ffn_prefix(cfg, layer)
    const = ~(params[f"{pre}.W_in"] != 0).any(dim=-2)
    if cfg.act == "swiglu":
        const = const & ~(params[f"{pre}.W_gate"] != 0).any(dim=-2)
    return const | units_silent(cfg, params, layer)


def layer_names(names: list[str], n_layers: int) -> str:
    """``blocks.0.ln1, blocks.1.ln1, ln_final`` → ``ln1 of every layer, ln_final`` (readable reasons)."""
    by_suffix: dict[str, list[int]] = {}
    rest = []
    for name in names:
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit():
            by_suffix.setdefault(parts[2], []).append(int(parts[1]))
        else:
            rest.append(name)
    out = []
    for suffix, layers in by_suffix.items():
        if sorted(layers) == list(range(n_layers)):
            out.append(f"{suffix} of every layer")
        else:
            out.append(f"{suffix} of layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, sorted(layers)))}")
    return ", ".join(out + rest)
