"""The torch checker on a rule: draw the declared groups' elements (κ-controlled, seeded), apply the
rule to a model's float64 parameters, and judge the output change with the same derived
tolerances as every built-in action (:func:`gauge_audit.numeric.compare`: κ·λ·√(L·K)·ε statistical,
κ·L·K·ε worst case).

κ is the rule's own amplification: for each map L·P·T of a parameter, κ(L)·κ(T) evaluated at every
unit (so ``W_K @ inv(transpose(M))`` counts κ(M), ``inv(diag(s)) @ W_O`` counts max|s|/min|s|, a
conjugated reader rule D_γ⁻¹·Rᵀ·D_γ counts κ(D_γ⁻¹·R·D_γ), as the built-in actions do), and no less
than the largest element's κ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..claims.rule import Rule
from ..models import Model, config_of
from ..models.config import Config
from ..numeric import CheckResult, compare, prepare
from ..runtime import generator
from .engine import Ctx, NotApplicable, ProjectView, Shape, applicability, apply, rounding_terms, sandwich_kappa, units
from .groups import sample

EPS64 = float(torch.finfo(torch.float64).eps)


@dataclass
class Draw:
    """The group elements of every unit, drawn from one seed, and their largest κ."""

    elements: dict[Ctx, dict[str, torch.Tensor]]
    kappa: float


def draw(rule: Rule, shape: Shape, seed: int, kappa: float = 10.0) -> Draw:
    """Elements for every unit in unit order, then declaration order: the same seed gives the same draw.
    The draw depends on the elements, the units and the dimensions alone, so the checkers of one
    rule (and its corrected rule, which keeps the group) share it (read-only)."""
    return _draw(
        tuple(rule.elements), tuple(units(rule, shape)), tuple(sorted(shape.dims.items())), seed, kappa, shape.planes
    )


@lru_cache(maxsize=64)
def _draw(elements: tuple, unit_list: tuple, dims: tuple, seed: int, kappa: float, planes: tuple = ()) -> Draw:
    g = generator(seed)
    out: dict = {}
    worst = 1.0
    shape_dims = dict(dims)
    for u in unit_list:
        out[u] = {}
        for el in elements:
            value, k = sample(el, shape_dims, g, kappa, planes)
            out[u][el.symbol] = value
            worst = max(worst, k)
    return Draw(out, worst)


def reason(rule: Rule, cfg: Config, keys) -> str | None:
    """Why the rule cannot act on this configuration (None: it can)."""
    return applicability(rule, Shape.of(cfg), lambda name: ProjectView(cfg, keys).has(name))


def tied_tolerance(rule: Rule, cfg: Config, kappa: float) -> float:
    """Relative tolerance of the tied-embedding check W_U' = (W_E')ᵀ: both sides carry ≲ κ·K·ε."""
    terms = sum(rounding_terms(m.node, Shape.of(cfg).dims) for m in rule.maps if m.param in ("W_E", "W_U"))
    return 2 * kappa * max(1, terms) * EPS64


def transform(cfg: Config, params: Mapping, rule: Rule, d: Draw) -> tuple[dict, float]:
    """The transformed parameters (float64, the model's layout) and the rule's κ at this draw."""
    view = ProjectView(cfg, params, tolerance=tied_tolerance(rule, cfg, d.kappa))
    with torch.no_grad():
        changes = apply(rule, view, d.elements)
        kappa = max(d.kappa, sandwich_kappa(rule, view, d.elements))
        new = view.updated(changes)
    if not changes:
        raise NotApplicable("the rule changes no parameter of this model")
    return new, kappa


def check_rule(
    model: Model,
    rule: Rule,
    inputs: dict | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype | str = torch.float64,
    kappa: float = 10.0,
    label: str = "rule",
    expected_holds: bool = True,
) -> CheckResult:
    """Apply ``rule`` to ``model`` (elements drawn from ``seed + 1``, inputs from ``seed``) and
    measure the output change against the derived tolerances."""
    why = reason(rule, model.cfg, model.params)
    if why:
        raise NotApplicable(f"the rule does not apply to {model.name}: {why}")
    dtype, inputs = prepare(model, dtype, inputs, seed)
    d = draw(rule, Shape.of(model.cfg), seed + 1, kappa)
    new, k = transform(model.cfg, model.params, rule, d)
    return compare(model, new, inputs, k, dtype, label, expected_holds, seed)


def models_for(rule: Rule, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The named models the rule applies to, and the reason for each one it does not."""
    ok, skipped = [], {}
    from ..models import param_shapes

    for name in names:
        cfg = config_of(name)
        why = reason(rule, cfg, param_shapes(cfg))
        if why:
            skipped[name] = why
        else:
            ok.append(name)
    return ok, skipped


__all__ = ["Draw", "check_rule", "draw", "models_for", "reason", "transform"]
