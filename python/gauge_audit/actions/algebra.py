"""The group law of every true gauge action: the inverse of an element and the product of two
elements of the same action (``compose(a, first, second)`` acts as ``first`` then ``second``).

These are what gauge fixing needs to return the element that maps one model to another, and to
shorten a chain of elements: two adjacent elements of one action become one.
"""

from __future__ import annotations

import torch

from ..errors import GaugeAuditError
from ..runtime import stacked_inv
from .base import Element, cond

# Elements that act by adding a parameter-independent vector (translations): inverse −x, product x + y.
ADDITIVE = (
    "key-bias-shift",
    "value-bias-fold",
    "norm-shift",
    "norm-shift-absorbed",
    "writer-ones",
    "reader-ones",
    "embed-offset",
    "router-offset",
    "segment-shift",
    "parallel-bias-trade",
)
# Elements that multiply entry by entry (diagonal scalings): inverse 1/s, product s·t.
DIAGONAL = (
    "norm-scale",
    "relu-scaling",
    "swiglu-scaling",
    "qk-norm-scale",
    "latent-norm-scale",
    "deepseek-swiglu-scaling",
)
# Stacks of invertible matrices acting on the right (W·M): inverse M⁻¹, product M₁·M₂.
# (The rotation's κ is that of D_γ⁻¹·R·D_γ, which depends on γ, not on R alone.)
# (Likewise a latent rotation's, through the latent norm's γ.)
MATRIX = ("qk-gl", "vo-gl", "stream-rotation", "mla-nope-gl", "mla-rope-commutant", "mla-vo-gl", "latent-rotation")
ROTATIONS = ("stream-rotation", "latent-rotation")  # orthogonal: inverse Rᵀ, κ kept as a bound
# Index maps new[i] = old[p[i]] along the last axis: inverse argsort, product p₁[p₂].
PERMUTATION = ("ffn-perm", "expert-perm", "mla-head-perm", "deepseek-expert-perm", "deepseek-ffn-perm")


def _scale_kappa(parts: dict) -> float:
    ks = [float(t.abs().max() / t.abs().min()) for t in parts.values() if t.numel()]
    return max(ks, default=1.0)


def kappa_of(action: str, parts: dict) -> float:
    """κ of an element of ``action`` from its parts alone (for elements read from files)."""
    if action in DIAGONAL:
        return _scale_kappa(parts)
    if action in ("qk-gl", "vo-gl", "mla-nope-gl", "mla-rope-commutant", "mla-vo-gl"):
        return max((cond(t) for t in parts.values()), default=1.0)
    return 1.0


def _union(a: dict, b: dict, fill, op) -> dict:
    out = {}
    for k in dict.fromkeys([*a, *b]):
        x = a.get(k)
        y = b.get(k)
        out[k] = op(x if x is not None else fill(y), y if y is not None else fill(x))
    return out


def inverse(action: str, el: Element) -> Element:
    """The element undoing ``el`` (same κ)."""
    p = el.parts
    if action in ADDITIVE:
        return Element({k: -v for k, v in p.items()}, el.kappa)
    if action in DIAGONAL:
        return Element({k: 1.0 / v for k, v in p.items()}, el.kappa)
    if action in ROTATIONS:
        return Element({k: v.transpose(-1, -2).clone() for k, v in p.items()}, el.kappa)
    if action in MATRIX:
        return Element({k: stacked_inv(v) for k, v in p.items()}, el.kappa)
    if action in PERMUTATION:
        return Element({k: torch.argsort(v, dim=-1) for k, v in p.items()}, 1.0)
    if action == "head-perm":
        kv, qp = p["kv_perm"], p["q_perm"]
        inv_kv = torch.argsort(kv, dim=-1)
        inv_qp = torch.empty_like(qp)
        for layer in range(kv.shape[0]):
            for j in range(kv.shape[1]):
                inv_qp[layer, kv[layer, j]] = torch.argsort(qp[layer, j])
        return Element({"kv_perm": inv_kv, "q_perm": inv_qp}, 1.0)
    if action == "qk-plane-turn":  # quarter turns of a plane add up modulo 4
        return Element({"turns": (4 - p["turns"].round()) % 4}, 1.0)
    raise GaugeAuditError(f"action {action} has no inverse here (not a true symmetry)")


def compose(action: str, first: Element, second: Element) -> Element:
    """One element of ``action`` acting as ``first`` followed by ``second``."""
    a, b = first.parts, second.parts
    kappa = first.kappa * second.kappa
    if action in ADDITIVE:
        return Element(_union(a, b, torch.zeros_like, torch.add), kappa)
    if action in DIAGONAL:
        parts = _union(a, b, torch.ones_like, torch.mul)
        return Element(parts, _scale_kappa(parts))
    if action in ROTATIONS:  # κ is that of C = D_γ⁻¹·R·D_γ, which needs γ: keep the bound
        return Element({k: a[k] @ b[k] for k in a}, kappa)
    if action in MATRIX:
        parts = {k: a[k] @ b[k] for k in a}
        return Element(parts, max(cond(t) for t in parts.values()))
    if action in PERMUTATION:
        return Element({k: torch.gather(a[k], -1, b[k]) for k in a}, 1.0)
    if action == "head-perm":
        kv1, qp1, kv2, qp2 = a["kv_perm"], a["q_perm"], b["kv_perm"], b["q_perm"]
        kv = torch.gather(kv1, -1, kv2)
        qp = torch.empty_like(qp1)
        for layer in range(kv1.shape[0]):
            for j in range(kv1.shape[1]):
                qp[layer, j] = qp1[layer, kv2[layer, j]][qp2[layer, j]]
        return Element({"kv_perm": kv, "q_perm": qp}, 1.0)
    if action == "qk-plane-turn":
        return Element({"turns": (a["turns"].round() + b["turns"].round()) % 4}, 1.0)
    raise GaugeAuditError(f"action {action} has no group law here (not a true symmetry)")
