"""The nullity report: the measured dimension, its explanation by families, the papers'
counts, and the maximality verdict (claim ``maximality``) computed from them.

Both measurement paths (dense in :mod:`.analysis`, matrix-free in :mod:`.matrixfree`)
build their result with :func:`make_report`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..models.config import Config
from ..models.deepseek import as_latent
from ..symbolic import counts
from . import explain as ex
from .families import Family
from .measure import Genericity, Problem


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
    v = e
    if cfg.latent_attention:  # MLA: the formulas read with its query/key and value head widths
        mla = as_latent(cfg)
        e, v = mla.nope_dim + mla.d_head, mla.v_dim
    rope = cfg.pos == "rope"
    # the RoPE variant's commutant over a head of d_k coordinates has dimension d_k (MLA's d_k may be odd)
    variant = L * g * (e + v * v) if cfg.latent_attention else L * counts.mgs_gqa_layer_dim(g, e, v, rope=rope)
    return {
        "mgs": int(counts.mgs_model_dim(L, h, e, v)),
        "mgs-variant": int(variant),
        "van-nierop": int(counts.nierop_redundancy(L, h, e, d)),
        "wiki-gqa": int(L * counts.wiki_gqa_layer_dim(h, g, e, v)),
        "wiki-log-hfact": float(L * counts.wiki_group_dim(h, e, v)),
    }


def gmax_dimension(cfg: Config) -> int:
    """dim G_max for this attention as the MGS paper defines it per architecture (its RoPE/GQA
    variant): the per-layer QK and VO groups, nothing else."""
    return int(paper_counts(cfg)["mgs-variant"])  # an int already (see paper_counts)


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
        return ex.flat_ranks(self.families)

    def to_json(self) -> dict:
        return {
            "config": {k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__},
            "seed": self.seed,
            "method": self.method,
            "params": self.params,
            "rows": self.rows,
            "rows_history": self.extra.get("rows_history", []),
            "converged": self.extra.get("converged"),
            "measured_nullity": self.measured_nullity,
            "explained": self.explained,
            "unexplained": self.unexplained,
            "families": self.family_dims(),
            "family_details": [
                {
                    "name": f.name,
                    "formula": f.formula,
                    "expected": f.expected,
                    "rank": f.rank,
                    "kind": f.kind,
                    "flat": f.flat,
                    "in_gmax": f.in_gmax,
                    "max_residual_rel": (f.residual / self.extra["j_fro"]) if f.residual is not None else None,
                }
                for f in self.families
            ],
            "gap_ratio": self.gap_ratio,
            "second_gap": self.second_gap,
            "threshold_rel": self.threshold_rel,
            "paper_counts": self.paper_counts,
            "gmax_dimension": gmax_dimension(self.cfg),
            "beyond_gmax": self.measured_nullity - gmax_dimension(self.cfg),
            "functional_dimension": self.functional_dimension,
            "fdof_bound": self.fdof_bound,
            "fdof_bound_holds": self.fdof_bound_holds,
            "generators_within_tolerance": self.generators_ok,
            "tolerance": self.tolerance_formula,
            "overlap": self.overlap,
            "genericity": {"clean": self.genericity.clean, "notes": self.genericity.lines()},
            "unexplained_blocks": self.unexplained_blocks,
            "timings_s": self.timings,
            "maximality": verdict(self).__dict__,
        }


def make_report(
    problem: Problem,
    gen: Genericity,
    fams: list[Family],
    expl: ex.Explanation,
    nullity: int,
    gap: float,
    second: float,
    thr_rel: float,
    method: str,
    timings: dict,
    j_fro: float,
    s: torch.Tensor | None,
) -> NullityReport:
    return NullityReport(
        cfg=problem.cfg,
        seed=problem.seed,
        method=method,
        params=problem.P,
        rows=problem.rows,
        measured_nullity=nullity,
        gap_ratio=gap,
        second_gap=second,
        threshold_rel=thr_rel,
        explained=expl.explained,
        unexplained=nullity - expl.explained,
        families=fams,
        paper_counts=paper_counts(problem.cfg),
        genericity=gen,
        tolerance_formula=expl.tolerance_formula,
        generators_ok=expl.all_within_tolerance,
        overlap=expl.overlap,
        singular_values=s,
        timings=timings,
        extra={"j_fro": j_fro, "predicted": expl.predicted},
    )


# ----------------------------------------------------------------------------- maximality verdict
@dataclass
class MaximalityVerdict:
    """Claim ``maximality``: is G_max (its RoPE/GQA variant) the whole continuous symmetry group?"""

    family: str
    config: str
    verdict: str  # HOLDS / FAILS / UNDECIDED (unexplained directions remain)
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
        why = (
            f"nullity {report.measured_nullity} exceeds dim G_max = {gmax} by "
            f"{report.measured_nullity - gmax}: " + ", ".join(f"{k} {n}" for k, n in beyond.items())
        )
    else:
        v, why = "FAILS", f"nullity {report.measured_nullity} is below dim G_max = {gmax}: G_max is not all symmetric"
    return MaximalityVerdict(cfg.family, label, v, report.measured_nullity, gmax, beyond, report.unexplained, why)


def describe(cfg: Config) -> str:
    parts = [f"L={cfg.n_layers} d={cfg.d_model} h={cfg.n_heads}/{cfg.n_kv_heads} d_k={cfg.d_head}"]
    if cfg.latent_attention:
        m = as_latent(cfg)
        parts = [
            f"L={m.n_layers} d={m.d_model} h={m.n_heads} MLA r_Q={m.q_lora_rank} r_KV={m.kv_lora_rank} "
            f"d_nope={m.nope_dim} d_rope={m.d_head} d_v={m.v_dim}"
        ]
        if m.experts:
            parts.append(f"moe_d_ff={m.moe_d_ff} shared={m.n_shared} dense-first={m.first_dense}")
    if not cfg.attention_only:
        parts.append(
            f"d_ff={cfg.d_ff} V={cfg.vocab} n={cfg.n_ctx} {cfg.act} {cfg.norm}"
            f"{'' if cfg.norm_placement == 'pre' else '-' + cfg.norm_placement}"
        )
        if cfg.experts:
            parts.append(f"E={cfg.experts} k={cfg.top_k}")
        if cfg.tied:
            parts.append("tied")
    parts.append("bias" if cfg.attn_bias else "no-bias")
    if cfg.pos == "rope":
        parts.append(f"rope R={cfg.rotary_dim}" if cfg.rotary_dim else "rope")
    if cfg.qk_norm != "none":
        parts.append(f"qk-norm={cfg.qk_norm}")
    if cfg.norm_eps == 0 and cfg.norm != "none":
        parts.append("ε=0")
    return " ".join(parts)
