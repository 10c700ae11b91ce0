"""The nullity audit end to end: measure, explain, compare with the papers' counts.

:func:`analyze` runs one configuration (dense or matrix-free) and returns a
:class:`NullityReport`; :func:`maximality_verdicts` runs the audit's standard
configurations and returns one structured verdict per family for the ``audit``
command (claim ``maximality``: is G_max the whole continuous symmetry group?).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..symbolic import counts
from . import explain as ex
from .generators import Family, families
from .measure import (Genericity, Problem, Spectrum, dense_jacobian, genericity, jvp_rows, make_problem, null_basis,
                      numerical_rank, progress, singular_values)

DENSE_LIMIT = 6000   # above this P the dense path is refused (memory and SVD time)


# ----------------------------------------------------------------------------- paper counts
def paper_counts(cfg: Config) -> dict[str, float]:
    """Each source's claimed symmetry dimension for this configuration (whole model).

    mgs: the headline G_Model = Σ_l h(d_k² + d_v²); mgs-variant: the paper's own RoPE / GQA
    variant for this attention (L·g·(d_k² or d_k, + d_v²)); van-nierop: eq. (17),
    2·n_t·n_h·d_h² + ½(d_e−1)(d_e−2); wiki-gqa: §7, L·(n_q·d_k² + n_kv·d_v²); wiki-log-hfact:
    §10.2, L·(h(d_k² + d_v²) + log h!) (not an integer).  Formulas from
    :mod:`gauge_audit.symbolic.counts`.
    """
    L, h, g, e, d = cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    rope = cfg.pos == "rope"
    return {
        "mgs": int(counts.mgs_model_dim(L, h, e, e)),
        "mgs-variant": int(L * counts.mgs_gqa_layer_dim(g, e, e, rope=rope)),
        "van-nierop": int(counts.nierop_redundancy(L, h, e, d)),
        "wiki-gqa": int(L * counts.wiki_gqa_layer_dim(h, g, e, e)),
        "wiki-log-hfact": float(L * counts.wiki_group_dim(h, e, e)),
    }


def gmax_dimension(cfg: Config) -> int:
    """dim G_max for this attention as the MGS paper defines it per architecture (its RoPE/GQA
    variant): the per-layer QK and VO groups, nothing else."""
    return paper_counts(cfg)["mgs-variant"]


# ----------------------------------------------------------------------------- report
@dataclass
class NullityReport:
    cfg: Config
    seed: int
    method: str
    params: int
    rows: int
    measured_nullity: int
    gap_ratio: float
    second_gap: float
    threshold_rel: float
    explained: int
    unexplained: int
    families: list[Family]
    paper_counts: dict[str, float]
    genericity: Genericity
    tolerance_formula: str
    generators_ok: bool
    overlap: int
    unexplained_blocks: list[tuple[str, float]] = field(default_factory=list)
    unexplained_examples: list[list[tuple[str, float]]] = field(default_factory=list)
    singular_values: torch.Tensor | None = field(default=None, repr=False)
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def functional_dimension(self) -> int:
        return self.params - self.measured_nullity

    @property
    def fdof_bound(self) -> float:
        """The wiki's claimed bound P / log P (natural log)."""
        return self.params / math.log(self.params)

    @property
    def fdof_bound_holds(self) -> bool:
        return self.functional_dimension <= self.fdof_bound

    def family_dims(self) -> dict[str, int]:
        return {f.name: f.rank for f in self.families if f.flat}

    def to_json(self) -> dict:
        return {
            "config": {k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__},
            "seed": self.seed, "method": self.method, "params": self.params, "rows": self.rows,
            "measured_nullity": self.measured_nullity, "explained": self.explained,
            "unexplained": self.unexplained, "families": self.family_dims(),
            "family_details": [{"name": f.name, "formula": f.formula, "expected": f.expected, "rank": f.rank,
                                "kind": f.kind, "flat": f.flat, "in_gmax": f.in_gmax,
                                "max_residual_rel": (f.residual / self.extra["j_fro"]) if f.residual is not None
                                else None} for f in self.families],
            "gap_ratio": self.gap_ratio, "second_gap": self.second_gap, "threshold_rel": self.threshold_rel,
            "paper_counts": self.paper_counts, "gmax_dimension": gmax_dimension(self.cfg),
            "beyond_gmax": self.measured_nullity - gmax_dimension(self.cfg),
            "functional_dimension": self.functional_dimension, "fdof_bound": self.fdof_bound,
            "fdof_bound_holds": self.fdof_bound_holds, "generators_within_tolerance": self.generators_ok,
            "tolerance": self.tolerance_formula, "overlap": self.overlap,
            "genericity": {"clean": self.genericity.clean, "notes": self.genericity.lines()},
            "unexplained_blocks": self.unexplained_blocks, "timings_s": self.timings,
            "maximality": verdict(self).__dict__,
        }


# ----------------------------------------------------------------------------- analyze
def analyze(cfg: Config, seed: int = 0, method: str = "dense", factor: float = 3.0, quiet: bool = True,
            mf_options: dict | None = None) -> NullityReport:
    """Measure the nullity of J at a generic point of ``cfg`` and explain it."""
    if method not in ("dense", "matrix-free"):
        raise GaugeAuditError(f"unknown method {method!r} (choose dense or matrix-free)")
    t0 = time.time()
    if method == "matrix-free":
        from .matrixfree import analyze_matrix_free
        return analyze_matrix_free(cfg, seed, quiet, t0, **(mf_options or {}))
    problem = make_problem(cfg, seed, factor=factor)
    if problem.P > DENSE_LIMIT:
        raise GaugeAuditError(f"P = {problem.P} parameters is above the dense limit {DENSE_LIMIT}; "
                              "use --method matrix-free")
    progress(f"{cfg.family}: P = {problem.P} parameters, {problem.rows} output rows "
             f"({problem.batch} sequences), method {method}", quiet)
    gen, fams = theory(problem, quiet)
    timings = {"setup": time.time() - t0}
    return _analyze_dense(problem, gen, fams, timings, quiet)


def theory(problem: Problem, quiet: bool) -> tuple[Genericity, list[Family]]:
    """The sample's genericity (reported) and every family of generators at this point."""
    gen = genericity(problem)
    for line in gen.lines():
        progress(f"non-generic sample: {line}", quiet)
    return gen, families(problem, gen)


def _analyze_dense(problem: Problem, gen: Genericity, fams: list[Family], timings: dict, quiet: bool
                   ) -> NullityReport:
    t = time.time()
    J = dense_jacobian(problem, quiet=quiet)
    timings["jacobian"] = time.time() - t
    t = time.time()
    s = singular_values(J, quiet=quiet)
    spec = numerical_rank(s)
    timings["svd"] = time.time() - t
    t = time.time()
    j_fro = ex.frobenius(J)
    JV = [f.vectors @ J.T for f in fams]
    expl = ex.check_families(problem, fams, JV, j_fro, spec.threshold)
    timings["generators"] = time.time() - t
    report = _report(problem, gen, fams, expl, spec.nullity, spec.gap_ratio, spec.second_gap,
                     spec.threshold / float(s[0]), "dense", timings, j_fro, s)
    if report.unexplained != 0 or not expl.all_within_tolerance:
        t = time.time()
        null = null_basis(J, spec.rank)
        u = ex.unexplained_directions(problem, null, expl.basis)
        report.unexplained_blocks = ex.summarize_blocks(u)
        report.unexplained_examples = u.blocks[:8]
        timings["unexplained"] = time.time() - t
    progress(f"measured nullity {spec.nullity}, explained {expl.explained}, gap {spec.gap_ratio:.3g}", quiet)
    return report


def _report(problem: Problem, gen: Genericity, fams: list[Family], expl: ex.Explanation, nullity: int,
            gap: float, second: float, thr_rel: float, method: str, timings: dict, j_fro: float,
            s: torch.Tensor | None) -> NullityReport:
    return NullityReport(
        cfg=problem.cfg, seed=problem.seed, method=method, params=problem.P, rows=problem.rows,
        measured_nullity=nullity, gap_ratio=gap, second_gap=second, threshold_rel=thr_rel,
        explained=expl.explained, unexplained=nullity - expl.explained, families=fams,
        paper_counts=paper_counts(problem.cfg), genericity=gen, tolerance_formula=expl.tolerance_formula,
        generators_ok=expl.all_within_tolerance, overlap=expl.overlap, singular_values=s, timings=timings,
        extra={"j_fro": j_fro, "predicted": expl.predicted})


# ----------------------------------------------------------------------------- maximality verdict
@dataclass
class MaximalityVerdict:
    """Claim ``maximality``: is G_max (its RoPE/GQA variant) the whole continuous symmetry group?"""

    family: str
    config: str
    verdict: str                 # HOLDS / FAILS / UNDECIDED (unexplained directions remain)
    measured_nullity: int
    gmax_dimension: int
    beyond_gmax: dict[str, int]  # the other families that make up the difference
    unexplained: int
    reason: str


def verdict(report: NullityReport) -> MaximalityVerdict:
    gmax = gmax_dimension(report.cfg)
    beyond = {f.name: f.rank for f in report.families if f.flat and not f.in_gmax and f.rank}
    cfg = report.cfg
    label = describe(cfg)
    if report.unexplained != 0:
        v, why = "UNDECIDED", f"{report.unexplained} measured flat dimensions are not explained by any family"
    elif report.measured_nullity == gmax:
        v, why = "HOLDS", "the measured symmetry dimension equals dim G_max"
    elif report.measured_nullity > gmax:
        v = "FAILS"
        why = (f"nullity {report.measured_nullity} exceeds dim G_max = {gmax} by "
               f"{report.measured_nullity - gmax}: " + ", ".join(f"{k} {n}" for k, n in beyond.items()))
    else:
        v, why = "FAILS", f"nullity {report.measured_nullity} is below dim G_max = {gmax}: G_max is not all symmetric"
    return MaximalityVerdict(cfg.family, label, v, report.measured_nullity, gmax, beyond, report.unexplained, why)


def describe(cfg: Config) -> str:
    parts = [f"L={cfg.n_layers} d={cfg.d_model} h={cfg.n_heads}/{cfg.n_kv_heads} d_k={cfg.d_head}"]
    if cfg.family != "attn":
        parts.append(f"d_ff={cfg.d_ff} V={cfg.vocab} n={cfg.n_ctx} {cfg.act} {cfg.norm}"
                     f"{'-post' if cfg.norm_placement == 'post' else ''}")
        if cfg.experts:
            parts.append(f"E={cfg.experts} k={cfg.top_k}")
        if cfg.tied:
            parts.append("tied")
    parts.append("bias" if cfg.attn_bias else "no-bias")
    if cfg.pos == "rope":
        parts.append("rope")
    if cfg.norm_eps == 0 and cfg.norm != "none":
        parts.append("ε=0")
    return " ".join(parts)


def standard_configs() -> list[Config]:
    """The audit's configurations, one or more per architecture family (small: dense, seconds each)."""
    from ..models import attn, bert, gpt2, llama, moe, qwen
    small = dict(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, d_ff=6, n_ctx=5, vocab=8)
    return [
        attn.config(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=5, attn_bias=False, out_bias=False),
        attn.config(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=5),
        attn.config(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=5, pos="rope", attn_bias=False,
                    out_bias=False),
        gpt2.config(n_layers=1, **small),
        bert.config(n_layers=1, **small),
        llama.config(n_layers=1, **{**small, "n_heads": 2, "n_kv_heads": 1}),
        qwen.config(n_layers=1, **{**small, "n_heads": 2, "n_kv_heads": 1}),
        moe.config(n_layers=1, experts=3, top_k=2, **{**small, "n_heads": 2, "n_kv_heads": 1}),
    ]


def maximality_verdicts(configs: list[Config] | None = None, seed: int = 0, quiet: bool = True
                        ) -> list[MaximalityVerdict]:
    """Per family: does G_max account for every measured flat direction?  (For the audit command.)"""
    return [verdict(analyze(c, seed=seed, quiet=quiet)) for c in (configs or standard_configs())]


__all__ = ["NullityReport", "MaximalityVerdict", "analyze", "paper_counts", "gmax_dimension", "verdict",
           "maximality_verdicts", "standard_configs", "describe", "Spectrum", "jvp_rows"]
