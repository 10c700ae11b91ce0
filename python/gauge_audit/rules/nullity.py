"""The nullity checker on a rule: its generators against the Jacobian and against the theory.

A rule with a continuous group defines, at a parameter point θ, one tangent vector per unit and
per basis element A of the group's Lie algebra: v = d/dt rule(θ; e + t·A)|_{t=0} (e the identity
element), computed by forward-mode differentiation of the same engine the torch checker uses
(:func:`torch.func.jvp` through :class:`~gauge_audit.rules.algebra.TorchOps`), laid out in the
nullity measurement's flat parameter vector.

* **flat or not**: a symmetry's generators are in ker J, so ‖J·v‖/‖v‖ must stay below the
  generator tolerance L·K·ε·‖J‖_F of :func:`gauge_audit.nullity.explain.generator_tolerance`
  (J·v by a JVP, J never formed);
* **new or not**: the components of the flat generators outside the span of the families the
  theory already explains (:class:`gauge_audit.nullity.explain.Span`, ``project_out``); a
  direction counts as new when more than √ε of it lies outside.  A genuinely new symmetry would
  lower the measured-but-unexplained nullity by that many dimensions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from torch.func import jvp

from ..claims.rule import Rule
from ..nullity.explain import Span, generator_tolerance, span_rank
from ..nullity.measure import EPS64, Problem, jvp_rows, make_problem
from .algebra import TorchOps
from .engine import NotApplicable, ProjectView, Shape, apply, units
from .groups import identity, tangent_basis


@dataclass
class RuleNullity:
    config: str
    generators: int  # tangent vectors (units × Lie-algebra dimension), non-zero ones
    rank: int  # their rank
    flat: bool  # every ‖J·v‖/‖v‖ within the tolerance
    max_residual_rel: float  # max ‖J·v‖/(‖v‖·‖J‖_F)
    tolerance_rel: float  # L·K·ε
    tolerance_formula: str
    new_directions: int  # flat generator directions outside the explained span
    measured_nullity: int
    explained: int
    unexplained_before: int
    unexplained_after: int
    contained_in: list[str] = field(default_factory=list)  # theory families whose span holds every flat generator

    def to_json(self) -> dict:
        return asdict(self)


def generators(rule: Rule, problem: Problem) -> torch.Tensor:
    """(k × P) tangent vectors of the rule at the problem's parameter point."""
    cfg = problem.cfg
    params = problem.params()
    view = ProjectView(cfg, params, TorchOps(check_singular=False, tangents=True))
    shape = Shape.of(cfg)
    ident = {u: {el.symbol: identity(el, shape.dims) for el in rule.elements} for u in units(rule, shape)}
    with torch.no_grad():
        base = apply(rule, view, ident)  # also checks a tied W_U once, on the primal
    keys = [k for k in base if not view._loc(*k).transposed]
    rows = []
    layout = problem.layout
    for u in ident:
        for el in rule.elements:
            for a in tangent_basis(el, shape.dims, shape.planes):

                def f(t, u=u, el=el, a=a):
                    els = {w: dict(v) for w, v in ident.items()}
                    els[u][el.symbol] = ident[u][el.symbol] + t * a
                    ch = apply(rule, view, els, check_tied=False)
                    return torch.cat([ch[k].reshape(-1) for k in keys])

                _, dv = jvp(f, (torch.zeros((), dtype=torch.float64),), (torch.ones((), dtype=torch.float64),))  # type: ignore[misc]  # torch types jvp as if has_aux=True (3-tuple)
                v = torch.zeros(layout.size, dtype=torch.float64)
                off = 0
                for name, ctx in keys:
                    loc = view._loc(name, ctx)
                    n = base[(name, ctx)].numel()
                    block = v[layout.span(loc.key)].view(layout.shapes[layout.names.index(loc.key)])
                    target = block[loc.index] if loc.index else block
                    target.copy_(dv[off : off + n].reshape(target.shape))
                    off += n
                rows.append(v)
    if not rows:
        raise NotApplicable("the rule's groups are finite (permutations): no generators")
    return torch.stack(rows)


def check(rule: Rule, report, seed: int = 0) -> RuleNullity:
    """``report``: the :class:`~gauge_audit.nullity.NullityReport` of the configuration (its
    parameter point is rebuilt from the same seed, its families give the explained span)."""
    from ..nullity.analysis import describe

    problem = make_problem(report.cfg, seed)
    V = generators(rule, problem)
    norms = torch.linalg.vector_norm(V, dim=1)
    V = V[norms > 0]
    if V.shape[0] == 0:
        raise NotApplicable("the rule moves no parameter of this configuration")
    j_fro = report.extra["j_fro"]
    tol, formula = generator_tolerance(problem, j_fro)
    JV = jvp_rows(problem, V)
    res = torch.linalg.vector_norm(JV, dim=1) / torch.linalg.vector_norm(V, dim=1)
    worst = float(res.max())
    flat_rows = V[res <= tol]
    rank = span_rank([V]).rank
    flat = bool((res <= tol).all())
    fams, theory, spans = _theory(report, problem.P)
    new = 0
    contained = []
    if flat_rows.shape[0]:
        unit = flat_rows / torch.linalg.vector_norm(flat_rows, dim=1, keepdim=True)
        new = int((torch.linalg.svdvals(theory.project_out(unit)) > math.sqrt(EPS64)).sum())
        contained = [f.name for f in fams if f.vectors.shape[0] and _inside(unit, spans[f.name])]
    return RuleNullity(
        f"{report.cfg.family} {describe(report.cfg)}",
        int(V.shape[0]),
        rank,
        flat,
        worst / j_fro,
        tol / j_fro,
        formula,
        new,
        report.measured_nullity,
        report.explained,
        report.unexplained,
        max(0, report.unexplained - new),
        contained,
    )


def _theory(report, P: int) -> tuple[list, Span, dict]:
    """The report's flat families, the span of all of them, and each one's span: the same for
    every rule checked against this report, so computed once and kept on it."""
    got = report.__dict__.get("_rule_theory")
    if got is None:
        fams = [f for f in report.families if f.flat]
        theory = span_rank([f.vectors for f in fams] or [torch.zeros(0, P, dtype=torch.float64)])
        got = (fams, theory, {f.name: span_rank([f.vectors]) for f in fams if f.vectors.shape[0]})
        report.__dict__["_rule_theory"] = got
    return got


def _inside(unit: torch.Tensor, span) -> bool:
    """Does the family's span hold every (unit) generator to within √ε?"""
    out = span.project_out(unit)
    return bool((torch.linalg.vector_norm(out, dim=1) <= math.sqrt(EPS64)).all())


__all__ = ["RuleNullity", "check", "generators"]
