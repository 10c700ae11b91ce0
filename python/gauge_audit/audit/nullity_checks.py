"""The nullity checker: measured Jacobian nullity and its explanation, read against
each claim.  Every configuration is analysed once per audit (cached in the context).

Catalog claims map to small configurations (dense path, seconds each); a user's
claim gives a ``formula`` for the symmetry dimension and ``params`` naming a small
architecture, and is compared with the measured nullity.
"""

from __future__ import annotations

from ..claims import Claim
from ..claims.expr import evaluate_formula
from ..errors import GaugeAuditError
from ..models import attn, bert, gpt2, llama, moe, qwen
from ..models.config import Config, generic_sizes
from .evidence import CORRECTED, FAILS, HOLDS, NOT_APPLICABLE, UNDECIDED, Evidence

SMALL = dict(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, d_ff=6, n_ctx=5, vocab=8, n_layers=1)
ATTN = dict(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=5)


def configs() -> dict[str, Config]:
    """The named small configurations the catalog's nullity evidence is measured on."""
    gqa = {**SMALL, "n_heads": 2, "n_kv_heads": 1}
    return {
        "attn": attn.config(**ATTN, attn_bias=False, out_bias=False),
        "attn-bias": attn.config(**ATTN),
        "attn-rope": attn.config(**ATTN, pos="rope", attn_bias=False, out_bias=False),
        "attn-gqa": attn.config(**{**ATTN, "n_heads": 4, "n_kv_heads": 2}, attn_bias=False, out_bias=False),
        "gpt2": gpt2.config(**SMALL),
        "gpt2-relu": gpt2.config(**SMALL, act="relu"),
        "gpt2-noaffine": gpt2.config(**SMALL, norm="layernorm-noaffine"),
        "llama": llama.config(**gqa),
        "bert": bert.config(**SMALL),
        "qwen": qwen.config(**gqa),
        "moe": moe.config(**gqa, experts=3, top_k=2),
    }


def generic_config(cfg: Config) -> Config:
    """``cfg`` at sizes where no structure a rule touches is special: RoPE with two rotary planes (at
    d_k = 2 one plane, where SO(2) commutes with RoPE), grouped-query attention with two groups of two
    query heads, and a stream wider than one head.  The same configuration when it is generic."""
    generic = generic_sizes(cfg)
    over: dict = {}
    if cfg.pos == "rope" and (cfg.rotary_dim or cfg.d_head) < 4:
        over.update(d_head=generic["d_head"], rotary_dim=generic["rotary_dim"])
    if cfg.n_kv_heads < cfg.n_heads and (cfg.n_kv_heads < 2 or cfg.n_heads // cfg.n_kv_heads < 2):
        over.update(n_heads=generic["n_heads"], n_kv_heads=generic["n_kv_heads"])
    if over:
        over["d_model"] = max(cfg.d_model, over.get("d_head", cfg.d_head) + 2)
    return cfg.with_(**over) if over else cfg


DEFAULT = ("attn", "attn-bias", "attn-rope", "attn-gqa", "gpt2", "gpt2-relu", "gpt2-noaffine", "llama")
FULL_ONLY = ("bert", "qwen", "moe")


def _analyze(ctx, name: str, cfg: Config | None = None):
    from ..nullity import analyze

    key = ("nullity", name)
    if key not in ctx.cache:
        ctx.cache[key] = analyze(cfg or configs()[name], seed=ctx.seed)
    return ctx.cache[key]


def _fam(report, name: str) -> int:
    """Rank of a family whose generators are verified flat (0 if absent or not flat)."""
    return next((f.rank for f in report.families if f.name == name and f.flat), 0)


def _summary(report) -> dict:
    return {
        "config": _describe(report.cfg),
        "params": report.to_json()["params"],
        "measured_nullity": report.measured_nullity,
        "explained": report.explained,
        "unexplained": report.unexplained,
        "gap_ratio": report.to_json()["gap_ratio"],
        "families": report.family_dims(),
        "paper_counts": report.to_json()["paper_counts"],
    }


def _describe(cfg: Config) -> str:
    from ..nullity.analysis import describe

    return f"{cfg.family} {describe(cfg)}"


def _unexplained(reports) -> Evidence | None:
    bad = [r for r in reports if r.unexplained]
    if bad:
        return Evidence(
            "nullity",
            UNDECIDED,
            "; ".join(f"{_describe(r.cfg)}: {r.unexplained} measured flat directions unexplained" for r in bad),
            {"reports": [_summary(r) for r in reports]},
        )
    return None


def _decide(ok: bool, text: str, details: dict, corrected: str | None = None) -> Evidence:
    """HOLDS when ``ok``; else HOLDS-WITH-CORRECTION when a corrected rule is known, else FAILS."""
    if ok:
        return Evidence("nullity", HOLDS, text, details)
    if corrected:
        return Evidence("nullity", CORRECTED, text, details, corrected_rule=corrected)
    return Evidence("nullity", FAILS, text, details, counterexample=text)


def _family_claim(
    ctx, cfg_name: str, family: str, expected_rank, claimed_ok, holds_text, fails_text, corrected=None
) -> Evidence:
    r = _analyze(ctx, cfg_name)
    bad = _unexplained([r])
    if bad:
        return bad
    rank = _fam(r, family)
    want = expected_rank(r.cfg)
    details = {"reports": [_summary(r)], "family": family, "rank": rank, "predicted_rank": want}
    if rank != want:
        return Evidence("nullity", UNDECIDED, f"{family} has rank {rank}, predicted {want}", details)
    ok = claimed_ok(r.cfg, rank)
    text = (holds_text if ok else fails_text).format(rank=rank, nullity=r.measured_nullity, cfg=_describe(r.cfg))
    return _decide(ok, text, details, corrected)


def _maximality(ctx, names) -> Evidence:
    from ..nullity.analysis import verdict

    reports = [_analyze(ctx, n) for n in names]
    bad = _unexplained(reports)
    if bad:
        return bad
    verdicts = [verdict(r) for r in reports]
    rows = [
        {
            "config": v.config,
            "family": v.family,
            "verdict": v.verdict,
            "measured_nullity": v.measured_nullity,
            "gmax_dimension": v.gmax_dimension,
            "beyond_gmax": v.beyond_gmax,
        }
        for v in verdicts
    ]
    details = {"per_config": rows, "reports": [_summary(r) for r in reports]}
    failing = [v for v in verdicts if v.verdict != "HOLDS"]
    if not failing:
        return Evidence("nullity", HOLDS, f"nullity = dim G_max on all {len(verdicts)} configurations", details)
    bias_free_attn = [v for v, r in zip(verdicts, reports) if r.cfg.attention_only and not r.cfg.attn_bias]
    extra: dict[str, int] = {}
    for v in failing:
        for k, n in v.beyond_gmax.items():
            extra[k] = max(extra.get(k, 0), n)
    text = f"nullity = dim G_max only on {len(verdicts) - len(failing)}/{len(verdicts)} configurations; " + "; ".join(
        f"{v.config}: {v.measured_nullity} vs {v.gmax_dimension}" for v in failing[:3]
    )
    rule = None
    if bias_free_attn and all(v.verdict == "HOLDS" for v in bias_free_attn):
        rule = (
            "G_max (G_RoPE, G_share) is the whole continuous group of a bias-free attention layer; with biases, "
            "norms, FFNs and embeddings the group is larger: " + ", ".join(sorted(extra))
        )
    return _decide(False, text, details, rule)


def _model_product(ctx, names) -> Evidence:
    reports = [_analyze(ctx, n) for n in names]
    bad = _unexplained(reports)
    if bad:
        return bad
    over = [(r, r.measured_nullity - r.to_json()["gmax_dimension"]) for r in reports]
    text = "; ".join(
        f"{_describe(r.cfg)}: nullity {r.measured_nullity} = Π G_Layer ({r.measured_nullity - d}) + {d}"
        for r, d in over
    )
    details = {"reports": [_summary(r) for r in reports]}
    if all(d == 0 for _, d in over):
        return Evidence("nullity", HOLDS, text, details)
    return Evidence("nullity", FAILS, "G_Model ⊋ Π_l G_Layer: " + text, details, counterexample=text)


def _count(ctx, cfg_name: str, paper: str, relation: str = "=") -> Evidence:
    r = _analyze(ctx, cfg_name)
    bad = _unexplained([r])
    if bad:
        return bad
    claimed = r.to_json()["paper_counts"][paper]
    ok = _compare(r.measured_nullity, claimed, relation)
    text = (
        f"{_describe(r.cfg)}: measured symmetry dimension {r.measured_nullity}, the {paper} formula gives "
        f"{claimed} (claimed relation: {relation})"
    )
    details = {"reports": [_summary(r)], "paper": paper, "claimed": claimed}
    return _decide(ok, text, details)


def _fdof(ctx, names) -> Evidence:
    reports = [_analyze(ctx, n) for n in names]
    rows = [
        {
            "config": _describe(r.cfg),
            "P": r.to_json()["params"],
            "fdof": r.functional_dimension,
            "P_over_logP": r.fdof_bound,
            "holds": r.fdof_bound_holds,
        }
        for r in reports
    ]
    ok = all(x["holds"] for x in rows)
    text = "; ".join(
        f"{x['config']}: fdof = P − nullity = {x['fdof']} vs P/log P = {x['P_over_logP']:.1f}" for x in rows[:3]
    )
    return _decide(ok, text, {"rows": rows})


def _compare(measured: float, claimed: float, relation: str) -> bool:
    if relation == ">=":
        return measured >= claimed
    if relation == "<=":
        return measured <= claimed
    if relation == "~":
        return abs(measured - claimed) <= 0.05 * max(abs(claimed), 1)
    return measured == claimed


def _catalog_checks(full: bool):
    rot_ln = lambda cfg: (cfg.d_model - 1) * (cfg.d_model - 2) // 2  # noqa: E731
    rot_rms = lambda cfg: cfg.d_model * (cfg.d_model - 1) // 2  # noqa: E731
    maxi = DEFAULT + (FULL_ONLY if full else ())
    return {
        "qk-gl": lambda ctx: _family_claim(
            ctx,
            "attn",
            "qk-gl",
            lambda c: c.n_kv_heads * c.d_head**2,
            lambda c, k: True,
            "qk-gl directions are flat: rank {rank} = h·d_k² ({cfg})",
            "",
        ),
        "vo-gl": lambda ctx: _family_claim(
            ctx,
            "attn",
            "vo-gl",
            lambda c: c.n_kv_heads * c.d_head**2,
            lambda c, k: True,
            "vo-gl directions are flat: rank {rank} = h·d_v² ({cfg})",
            "",
        ),
        "qk-orthogonal-only": lambda ctx: _family_claim(
            ctx,
            "attn",
            "qk-gl",
            lambda c: c.n_kv_heads * c.d_head**2,
            lambda c, k: k == c.n_heads * c.d_head * (c.d_head - 1) // 2,
            "",
            "the flat QK directions have rank {rank} = h·d_k², not h·d_k(d_k−1)/2 (O(d_k)^h) ({cfg})",
        ),
        "rope-commutant": lambda ctx: _family_claim(
            ctx,
            "attn-rope",
            "qk-gl",
            lambda c: c.n_kv_heads * c.d_head,
            lambda c, k: True,
            "under RoPE the flat QK directions have rank {rank} = h·d_k (commutant ∏ GL(1,ℂ)); nullity {nullity} "
            "({cfg})",
            "",
        ),
        "gqa-tied": lambda ctx: _family_claim(
            ctx,
            "attn-gqa",
            "qk-gl",
            lambda c: c.n_kv_heads * c.d_head**2,
            lambda c, k: _analyze(ctx, "attn-gqa").measured_nullity == c.n_kv_heads * 2 * c.d_head**2,
            "GQA: nullity {nullity} = g·(d_k² + d_v²) with g KV groups ({cfg})",
            "GQA: nullity {nullity} ≠ g·(d_k² + d_v²) ({cfg})",
        ),
        "gqa-wiki-formula": lambda ctx: _count(ctx, "attn-gqa", "wiki-gqa"),
        "ln-affine-rotation": lambda ctx: _family_claim(
            ctx,
            "gpt2",
            "stream-rotation",
            rot_ln,
            lambda c, k: False,
            "",
            "affine LayerNorm: the (d−1)(d−2)/2 = {rank} rotation directions are flat only with the corrected "
            "reader rule (readers D_γ⁻¹·Rᵀ·D_γ, β ↦ β·C) ({cfg})",
            corrected="β ↦ β·C, readers W ↦ C⁻¹·W with C = D_γ⁻¹·R·D_γ",
        ),
        "ln-noaffine-rotation": lambda ctx: _family_claim(
            ctx,
            "gpt2-noaffine",
            "stream-rotation",
            rot_ln,
            lambda c, k: True,
            "LayerNorm without affine: {rank} = (d−1)(d−2)/2 flat rotation directions ({cfg})",
            "",
        ),
        "rmsnorm-rotation": lambda ctx: _family_claim(
            ctx,
            "llama",
            "stream-rotation",
            rot_rms,
            lambda c, k: k == rot_ln(c),
            "",
            "RMSNorm: {rank} = d(d−1)/2 flat rotation directions (SO(d)), more than (d−1)(d−2)/2 ({cfg})",
            corrected="the stream symmetry of RMSNorm models is SO(d_e), of dimension d_e(d_e−1)/2",
        ),
        "relu-forces-identity": lambda ctx: _family_claim(
            ctx,
            "gpt2-relu",
            "relu-scaling",
            lambda c: c.n_layers * c.d_ff,
            lambda c, k: k == 0,
            "",
            "ReLU: {rank} flat per-neuron scaling directions, so f(0) = f(1) = 1 is not forced ({cfg})",
        ),
        "maximality": lambda ctx: _maximality(ctx, maxi),
        "maximality-model": lambda ctx: _model_product(ctx, ("gpt2", "llama")),
        "count-nierop": lambda ctx: _count(ctx, "gpt2", "van-nierop"),
        "count-transformer-base": lambda ctx: _count(ctx, "bert" if full else "gpt2", "mgs", ">="),
        "fdof-bound": lambda ctx: _fdof(ctx, ("gpt2", "llama")),
        "mgs-persists-layernorm": lambda ctx: _family_claim(
            ctx,
            "gpt2",
            "qk-gl",
            lambda c: c.n_layers * c.n_kv_heads * c.d_head**2,
            lambda c, k: True,
            "with affine LayerNorm the qk-gl directions stay flat: rank {rank} = L·h·d_k² ({cfg})",
            "",
        ),
        "mgs-qk-vo-factorize": lambda ctx: _factorize(ctx, "attn"),
        "review-relu-positive-scaling": lambda ctx: _family_claim(
            ctx,
            "gpt2-relu",
            "relu-scaling",
            lambda c: c.n_layers * c.d_ff,
            lambda c, k: k > 0,
            "ReLU: {rank} flat per-neuron positive-scaling directions ({cfg})",
            "",
        ),
        "review-eq17-incomplete": lambda ctx: _family_claim(
            ctx,
            "gpt2-relu",
            "relu-scaling",
            lambda c: c.n_layers * c.d_ff,
            lambda c, k: k > 0,
            "eq. (17) has no term for the {rank} flat ReLU-scaling directions (nullity {nullity}, {cfg})",
            "no ReLU scaling directions ({cfg})",
        ),
        "desk-count-noaffine": lambda ctx: _count(ctx, "gpt2-noaffine", "van-nierop"),
        "pith-flat-valley-dim": lambda ctx: _count(ctx, "gpt2", "van-nierop"),
        "wiki-gqa-shared-value": lambda ctx: _family_claim(
            ctx,
            "attn-gqa",
            "vo-gl",
            lambda c: c.n_kv_heads * c.d_head**2,
            lambda c, k: k == c.n_kv_heads * c.d_head**2 < c.n_heads * c.d_head**2,
            "shared values: the flat V–O directions have rank {rank} = n_kv·d_v², fewer than n_q·d_v² ({cfg})",
            "V–O rank {rank} ({cfg})",
        ),
        "wiki-flat-minima": lambda ctx: _flat(ctx, ("attn", "gpt2", "llama")),
    }


def _factorize(ctx, cfg_name: str) -> Evidence:
    """Every flat direction is a sum of a QK generator and a VO generator: nullity = rank(qk) + rank(vo)
    (the Lie algebra is the direct sum, no direction mixes the two)."""
    r = _analyze(ctx, cfg_name)
    bad = _unexplained([r])
    if bad:
        return bad
    qk, vo = _fam(r, "qk-gl"), _fam(r, "vo-gl")
    text = (
        f"{_describe(r.cfg)}: nullity {r.measured_nullity} = rank qk-gl {qk} + rank vo-gl {vo}: "
        f"{r.measured_nullity == qk + vo}"
    )
    return _decide(r.measured_nullity == qk + vo, text, {"reports": [_summary(r)], "qk": qk, "vo": vo})


def _flat(ctx, names) -> Evidence:
    """A positive nullity at every configuration: each function has a manifold of parameter points."""
    reports = [_analyze(ctx, n) for n in names]
    rows = [(_describe(r.cfg), r.measured_nullity) for r in reports]
    ok = all(n > 0 for _, n in rows)
    return _decide(ok, "; ".join(f"{c}: nullity {n}" for c, n in rows), {"rows": rows})


_USER_KEYS = {
    "family",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "d_head",
    "d_ff",
    "n_ctx",
    "vocab",
    "n_layers",
    "act",
    "norm",
    "attn_bias",
    "out_bias",
    "mlp_bias",
    "pos",
    "tied",
    "experts",
    "top_k",
}
_FAMILY_CONFIG = {
    "attn": attn.config,
    "gpt2": gpt2.config,
    "bert": bert.config,
    "llama": llama.config,
    "qwen": qwen.config,
    "moe": moe.config,
}


def _user_claim(claim: Claim, ctx) -> Evidence:
    p = dict(claim.params)
    if claim.formula is None or "family" not in p:
        return Evidence(
            "nullity", NOT_APPLICABLE, "a nullity check needs `formula` and `params.family` (a small architecture)"
        )
    fam = p["family"]
    if fam not in _FAMILY_CONFIG:
        raise GaugeAuditError(f"{claim.file}:{claim.line}: field params.family: unknown family {fam!r}")
    overrides = {k: v for k, v in p.items() if k in _USER_KEYS and k != "family"}
    if "n_heads" in overrides and "n_kv_heads" not in overrides:
        overrides["n_kv_heads"] = overrides["n_heads"]  # multi-head attention unless GQA is asked for
    cfg = _FAMILY_CONFIG[fam](**overrides)
    numeric = {k: v for k, v in p.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    claimed = evaluate_formula(claim.formula, numeric)
    if not claimed.is_number:
        raise GaugeAuditError(
            f"{claim.file}:{claim.line}: field formula: {claim.formula!r} does not evaluate "
            f"to a number with the claim's params"
        )
    r = _analyze(ctx, f"user:{claim.id}", cfg)
    bad = _unexplained([r])
    if bad:
        return bad
    ok = _compare(r.measured_nullity, float(claimed), claim.relation)
    text = (
        f"{_describe(cfg)}: measured symmetry dimension {r.measured_nullity} "
        f"({', '.join(f'{k} {v}' for k, v in r.family_dims().items())}); the claim's formula gives {claimed}"
    )
    return _decide(ok, text, {"reports": [_summary(r)], "claimed": str(claimed)})


def nullity(claim: Claim, ctx) -> Evidence:
    checks = _catalog_checks(ctx.full)
    if claim.id in checks and claim.file.startswith("claims/") and "/examples/" not in claim.file:
        return checks[claim.id](ctx)
    return _user_claim(claim, ctx)
