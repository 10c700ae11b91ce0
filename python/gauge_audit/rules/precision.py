"""The precision checker on a rule: the same engine in mpmath at 30 / 50 / 100 digits, and an
interval-certified counterexample when the rule is not a symmetry.

Residuals (as :func:`gauge_audit.precision.check_action` for the built-in actions): a one-layer
tiny model the rule applies to, its float64 parameters taken as exact, the torch draw of the
elements taken as exact (rotations made exactly orthogonal by the Cayley transform), the rule
applied with :class:`~gauge_audit.rules.algebra.ListOps` on ``mpf`` (inverses by Gauss–Jordan at
the working precision), both parameter sets run through the independent mpmath model; HOLDS when
max|y′ − y|/max|y| ≤ κ·L·K·u(dps) at every dps and shrinking with dps, FAILS when it stays
≥ 10⁻³.

Certificate (for a failing rule): a smaller copy of the model (d_model 4, one layer), its
parameters and inputs rounded to dyadic rationals, the element rounded to a 1/16 grid and kept in
its group (exact Cayley rotations, non-zero diagonals), the rule applied in exact rational
arithmetic, both models evaluated in interval arithmetic: an output interval that excludes 0
proves the function changed.  With a corrected rule (derived by the symbolic checker), the same
data under the correction gives intervals that all contain 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from functools import lru_cache

import torch

from ..claims.rule import Rule
from ..errors import GaugeAuditError
from ..models import NAMED, build_config, config_of
from ..models.config import Config, generic_sizes
from ..numeric import path_length
from ..precision.block import MP, exact_params, forward, workdps
from ..precision.certify import (
    CERT_DPS,
    ELEMENT_GRID,
    Certificate,
    attach_control,
    certificate_inputs,
    certify_transform,
    rational_params,
)
from ..precision.residual import BATCH, DEFAULT_DPS, SEQ, DpsResidual, dps_verdict, relative, unit_roundoff
from .algebra import ListOps
from .engine import NotApplicable, ProjectView, Shape, apply
from .groups import dyadic, exact
from .torch_check import draw, reason, transform


@dataclass
class RulePrecision:
    model: str
    seed: int
    kappa: float
    verdict: str  # HOLDS / FAILS / INCONCLUSIVE
    residuals: list[DpsResidual]
    shrinks: bool
    bound_formula: str
    certificate: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)


def default_model(rule: Rule, names: list[str] | None = None) -> str:
    """The first named tiny model (table order, or among ``names``) the rule applies to."""
    from ..models import param_shapes

    for name in names or list(NAMED):
        if name == "minilm":
            continue
        cfg = config_of(name)
        if reason(rule, cfg, param_shapes(cfg)) is None:
            return name
    raise NotApplicable("the rule applies to no tiny reference model")


def _exact_elements(rule: Rule, elements: dict, num, planes: tuple = ()) -> dict:
    return {u: {el.symbol: exact(el, v[el.symbol], num, planes) for el in rule.elements} for u, v in elements.items()}


def _apply_lists(rule: Rule, cfg: Config, P: dict, elements: dict, num) -> dict:
    view = ProjectView(cfg, P, ListOps(num))
    return view.updated(apply(rule, view, elements))


def check(
    rule: Rule,
    model: str | None = None,
    dps=DEFAULT_DPS,
    seed: int = 0,
    kappa: float = 10.0,
    certify: bool = True,
    corrected: Rule | None = None,
    progress=None,
) -> RulePrecision:
    name = model or default_model(rule)
    if name == "minilm":
        raise GaugeAuditError("the mpmath reference runs on the tiny models only")
    cfg, m, inputs = _one_layer(name, seed)
    why = reason(rule, cfg, m.params)
    if why:
        raise NotApplicable(f"the rule does not apply to {name}: {why}")
    d = draw(rule, Shape.of(cfg), seed + 1, kappa)
    _, k = transform(cfg, m.params, rule, d)
    K, k_text = path_length(cfg, SEQ)
    rows = []
    for i, dd in enumerate(sorted(set(dps))):
        with workdps(dd):
            P, y0 = _reference(name, seed, dd)
            Q = _apply_lists(rule, cfg, P, _exact_elements(rule, d.elements, MP.num, Shape.of(cfg).planes), MP.num)
            r = relative(y0, forward(cfg, Q, inputs, MP))
            res = float(r)
        bound = k * K * unit_roundoff(dd)
        rows.append(DpsResidual(dd, res, None if res == 0 else math.log10(res), bound, res <= bound))
        if progress:
            progress(i + 1, len(set(dps)))
    verdict, shrinks = dps_verdict(rows)
    out = RulePrecision(name, seed, k, verdict, rows, shrinks, f"κ·L·K·u = {k:.3g}·1·{K}·2^(1−prec)  (K = {k_text})")
    if certify and verdict == "FAILS":
        cert = certificate(rule, cfg, seed, corrected)
        out.certificate = cert.to_json() if cert else None
    return out


@lru_cache(maxsize=16)
def _one_layer(name: str, seed: int):
    """The one-layer copy of a tiny model and its inputs (deterministic in the seed; read-only)."""
    cfg = config_of(name).with_(n_layers=1)
    m = build_config(cfg, seed, "cpu", torch.float64, name=f"{name} (1 layer)")
    return cfg, m, m.sample_inputs(seed, batch=BATCH, n=SEQ)


@lru_cache(maxsize=32)
def _reference(name: str, seed: int, dps: int) -> tuple[dict, list]:
    """The one-layer model's exact parameters and its mpmath output at ``dps`` digits (call inside
    ``workdps(dps)``): the same for every rule checked on it, so computed once per process.  Both
    are nested lists of immutable numbers that the rule engine copies, never changes."""
    cfg, m, inputs = _one_layer(name, seed)
    P = exact_params(m.params, MP)
    return P, forward(cfg, P, inputs, MP)


def certificate_config(cfg: Config) -> Config:
    """A smaller copy of the architecture for interval arithmetic (d_model 4, one layer), at sizes where
    no structure is special: RoPE with two rotary planes (and a pass-through block of two for a
    partial rotary), grouped-query attention with two groups of two query heads."""
    over: dict = dict(d_model=4, n_layers=1, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=3)
    over.update(generic_sizes(cfg))
    if not cfg.attention_only:
        over.update(d_ff=8, vocab=8)
    return cfg.with_(**over)


def certificate(rule: Rule, cfg: Config, seed: int = 0, corrected: Rule | None = None) -> Certificate | None:
    """Interval-certified counterexample (None for a mixture of experts: top-k on intervals is not
    decidable)."""
    if cfg.experts:
        return None
    c = certificate_config(cfg)
    model = build_config(c, seed, "cpu", torch.float64, name="certificate")
    if reason(rule, c, model.params):
        return None
    d = draw(rule, Shape.of(c), seed + 1, 4.0)
    with workdps(CERT_DPS):
        P = rational_params(model.params)
        els = {
            u: {el.symbol: dyadic(el, v[el.symbol], ELEMENT_GRID, Shape.of(c).planes) for el in rule.elements}
            for u, v in d.elements.items()
        }
        Q = _apply_lists(rule, c, P, els, Fraction)
        first = next(iter(els.values()))
        text = "; ".join(f"{s} = {_mat(v)}" for s, v in first.items()) + (" (first unit)" if len(els) > 1 else "")
        facts = [f"{el.symbol} ∈ {el.text()} exactly (rational arithmetic)" for el in rule.elements]
        inputs = certificate_inputs(c, seed)
        cert = certify_transform("rule", "rule", c, P, Q, inputs, text, facts, CERT_DPS)
        if corrected is not None and not reason(corrected, c, model.params):
            Qc = _apply_lists(corrected, c, P, els, Fraction)
            attach_control(cert, c, P, Qc, inputs, "the derived corrected rule on the same rational data")
    return cert


def _mat(m: list) -> str:
    return "[" + "; ".join(" ".join(str(x) for x in row) for row in m) + "]"


__all__ = ["RulePrecision", "certificate", "check", "default_model"]
