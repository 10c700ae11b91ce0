"""What a gauge action is, and the group-element helpers every action shares.

An :class:`Action` is a named *pure* function ``apply(cfg, params, element) ->
new params`` together with how to draw a random group element, when the action
applies to an architecture, and whether it is claimed to be a true symmetry
(``symmetry=False`` marks the deliberate false contrasts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..runtime import stacked_det

# Read-only: a plain dict or parameters read lazily from a checkpoint.
Params = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Element:
    """A group element: named tensors (float64, CPU) plus its condition number κ,
    the factor by which applying it can amplify rounding errors."""

    parts: dict[str, torch.Tensor]
    kappa: float
    note: str = ""


@dataclass(frozen=True)
class Special:
    """A special point of a false contrast: a stratum on which its rule is exactly function-preserving
    (see strata.py), and how far this parameter point is from it."""

    reason: str  # why the rule holds on the stratum ("γ ∝ 1 in every norm, so …")
    defect: float = 0.0  # relative distance of the point from the stratum (0: on it)


@dataclass(frozen=True)
class Action:
    name: str
    group: str  # the group, in words
    symmetry: bool | Callable[[Config], bool]  # a true symmetry here? (False: a named false contrast)
    applies: Callable[[Config], str | None]  # None, or why the action does not apply
    sample: Callable[..., Element]  # (cfg, params, generator, kappa) -> Element
    apply: Callable[[Config, Params, Element], Params]
    claim: str | None = None  # the catalog claim it tests
    generic_kappa: bool = True  # does sample() honour the requested κ?
    # MoE: maps the transformed model's expert labels (layer l, indices) back to the original's.
    expert_relabel: Callable[[Element, int, torch.Tensor], torch.Tensor] | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)
    # How the element's parts split over blocks (see blockwise.restrict): "layers" — every part
    # has a leading layer axis; "norms" — parts are keyed by norm prefix ("blocks.3.ln1",
    # "ln_final"); "shared" — one element acts on every block and on the embeddings/head;
    # "whole" — the element couples blocks and the embeddings (a composite of many actions, a
    # translation carried along the stream): applied to the whole model at once, lazily read
    # parameters read in first.
    element_layout: str = "layers"
    # A contrast's special points (see strata.py): (cfg, params, positions n, ε of the working
    # dtype) -> the nearest stratum on which the rule holds exactly, with the point's distance
    # from it, or None when the point is on none and near none.
    special: Callable[[Config, Params, int, float], Special | None] | None = None

    def expected_holds(self, cfg: Config) -> bool:
        """What the theory predicts for this architecture (True: the function is unchanged)."""
        return self.symmetry(cfg) if callable(self.symmetry) else bool(self.symmetry)

    def expected_at(self, cfg: Config, params: Params, n: int, eps: float) -> tuple[bool, Special | None]:
        """What the theory predicts at this parameter point, for inputs of n positions computed with
        unit roundoff ``eps``: (holds, the nearest special point or None).  On a special point
        (defect ≤ ε: closer than one rounding) a contrast holds; off it, it fails, and the caller
        decides whether the defect is too small for the failure to be resolved.  Only a contrast
        predicted to fail has special points; a true symmetry holds at every point."""
        generic = self.expected_holds(cfg)
        if generic or self.special is None:
            return generic, None
        near = self.special(cfg, params, n, eps)
        return (near is not None and near.defect <= eps), near

    @property
    def doc(self) -> str:
        return (self.apply.__doc__ or "").strip()


def updated(params: Params, changes: Params) -> Params:
    """A new dict: ``params`` with ``changes`` replacing entries (inputs untouched)."""
    out = dict(params)
    out.update(changes)
    return out


def as64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def put(t64: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Computed in float64 on the CPU, stored back in the parameter's dtype/device."""
    return t64.to(device=like.device, dtype=like.dtype)


def random_orthogonal(n: int, g: torch.Generator, special: bool = False) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))[None, :]  # Haar measure
    if special and stacked_det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def rotation_fixing_ones(n: int, g: torch.Generator) -> torch.Tensor:
    """R = 11ᵀ/n + U·Q·Uᵀ (U an orthonormal basis of 1^⊥, Q ∈ SO(n−1)): R·1 = 1, det R = 1 —
    a random rotation of a LayerNorm stream (it must fix the all-ones direction)."""
    if n == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    basis, _ = torch.linalg.qr(
        torch.cat(
            [torch.ones(n, 1, dtype=torch.float64), torch.randn(n, n - 1, generator=g, dtype=torch.float64)], dim=1
        )
    )
    u = basis[:, 1:]
    return torch.ones(n, n, dtype=torch.float64) / n + u @ random_orthogonal(n - 1, g, special=True) @ u.T


def random_gl(n: int, g: torch.Generator, kappa: float) -> torch.Tensor:
    """U·diag(s)·Vᵀ with singular values log-spaced in [κ^-1/2, κ^1/2]: κ(M) = κ exactly."""
    if kappa < 1:
        raise GaugeAuditError(f"condition number must be >= 1, got {kappa}")
    u, v = random_orthogonal(n, g), random_orthogonal(n, g)
    if n == 1:
        s = torch.tensor([1.0], dtype=torch.float64) * (1.0 if torch.rand(1, generator=g) < 0.5 else -1.0)
        return s.reshape(1, 1) * (kappa**0.5 if kappa > 1 else 1.0)
    s = torch.logspace(-0.5, 0.5, n, base=kappa, dtype=torch.float64)
    s = s[torch.randperm(n, generator=g)]
    return u @ torch.diag(s) @ v.T


def cond(m: torch.Tensor) -> float:
    """Largest 2-norm condition number over a stack of square matrices."""
    m = m.reshape(-1, m.shape[-2], m.shape[-1])
    sv = torch.linalg.svdvals(m)
    if not torch.isfinite(sv).all() or (sv[:, -1] == 0).any():
        return float("inf")
    return float((sv[:, 0] / sv[:, -1]).max())


def require_invertible(name: str, m: torch.Tensor, limit: float = 1e14) -> float:
    """κ(m), or a one-line error for a singular / non-finite / wrongly shaped element."""
    if m.shape[-1] != m.shape[-2]:
        raise GaugeAuditError(f"{name} must be square, got shape {tuple(m.shape)}")
    if not torch.isfinite(m).all():
        raise GaugeAuditError(f"{name} contains NaN or infinite entries")
    k = cond(m)
    if not (k < limit):
        raise GaugeAuditError(f"{name} is singular or numerically singular (condition number {k:.3g})")
    return k


def require_shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise GaugeAuditError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if not torch.isfinite(t).all():
        raise GaugeAuditError(f"{name} contains NaN or infinite entries")


def attn_prefixes(cfg: Config) -> list[str]:
    return [f"blocks.{i}.attn" for i in range(cfg.n_layers)]


def query_heads(cfg: Config, j: int) -> range:
    """The query heads served by KV head j."""
    return range(j * cfg.group_size, (j + 1) * cfg.group_size)
