"""The pieces every family builder shares: the :class:`Family` record, the :class:`Rows`
accumulator of tangent vectors in the flat parameter layout, and small index helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...models.config import Config
from ..measure import Layout

LN = ("layernorm", "layernorm-noaffine")


AFFINE = ("layernorm", "rmsnorm")


@dataclass
class Family:
    name: str
    formula: str  # the dimension formula, in the config's symbols
    expected: int  # the formula evaluated
    vectors: torch.Tensor  # (k × P) generators
    doc: str  # derivation (one paragraph)
    kind: str = "exact"  # exact | eps-broken | data
    in_gmax: bool = False  # part of MGS G_max (the per-head GL(d_k) × GL(d_v))
    residual: float | None = None  # max ‖J·v‖ / ‖v‖ (set by explain)
    tolerance: float | None = None  # the bound it was checked against (relative to ‖J‖_F)
    rank: int | None = None  # rank of the vectors (set by explain)
    flat: bool = True  # counted as flat (eps-broken: decided against the gap threshold)
    extra: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.vectors.shape[0])


class Rows:
    """Accumulates tangent vectors; ``new()`` returns a zero vector and ``at(v, name)``
    the writable view of one parameter tensor inside it."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.rows: list[torch.Tensor] = []

    def new(self) -> torch.Tensor:
        v = torch.zeros(self.layout.size, dtype=torch.float64)
        self.rows.append(v)
        return v

    def at(self, v: torch.Tensor, name: str) -> torch.Tensor:
        i = self.layout.names.index(name)
        return v[self.layout.span(name)].view(self.layout.shapes[i])

    def matrix(self) -> torch.Tensor:
        if not self.rows:
            return torch.zeros(0, self.layout.size, dtype=torch.float64)
        return torch.stack(self.rows)


def make_family(layout: Layout, name: str, formula: str, expected: int, rows: Rows, doc: str, **kw) -> Family:
    return Family(name, formula, int(expected), rows.matrix(), " ".join(doc.split()), **kw)


def attn_prefixes(cfg: Config) -> list[str]:
    return [f"blocks.{i}.attn" for i in range(cfg.n_layers)]


def complement_of_ones(d: int) -> torch.Tensor:
    """An orthonormal basis (rows) of 1^⊥ in R^d."""
    m = torch.eye(d, dtype=torch.float64) - torch.full((d, d), 1.0 / d, dtype=torch.float64)
    q, _ = torch.linalg.qr(m[:, : d - 1])
    return q.T.contiguous()


def null_rows(m: torch.Tensor, n: int) -> torch.Tensor:
    """Rows: an orthonormal basis of {x ∈ R^n : m·x = 0}."""
    if m.shape[0] == 0:
        return torch.eye(n, dtype=torch.float64)
    _, s, vh = torch.linalg.svd(m, full_matrices=True)
    r = int((s > s[0] * max(m.shape) * 1e-12).sum()) if s.numel() and float(s[0]) > 0 else 0
    return vh[r:].contiguous()


def has_param(p: dict, name: str) -> bool:
    return name in p or (name == "embed.W_E^T" and "embed.W_E" in p)


def is_router(name: str) -> bool:
    return name.endswith("W_router")
