"""Count claims: reproduce the papers' numbers from their formulas and compare with the corrected count."""

from __future__ import annotations

from typing import Any

import sympy as sp

from ..claims.expr import evaluate_formula, parse_formula
from ..errors import GaugeAuditError
from . import counts
from .lie import attention_symmetry_dim
from .registry import claim, derivation
from .result import Derivation, decide


def _relation_holds(value, claimed, relation: str) -> bool:
    value, claimed = sp.nsimplify(value), sp.nsimplify(claimed)
    if relation == "=":
        return sp.simplify(value - claimed) == 0
    if relation == ">=":
        return bool(value >= claimed)
    if relation == "<=":
        return bool(value <= claimed)
    return bool(abs(value - claimed) <= sp.Rational(5, 100) * abs(claimed))  # "~": within 5 %


def _arch(name: str) -> counts.ArchConfig:
    try:
        return counts.ARCHITECTURES[name]
    except KeyError:
        raise GaugeAuditError(f"unknown architecture {name!r} (known: {', '.join(counts.ARCHITECTURES)})") from None


def _formula(cl) -> str:
    """The formula of a counting claim (every claim these derivations settle states one)."""
    if cl.formula is None:  # pragma: no cover - the catalog's counting claims all have one
        raise GaugeAuditError(f"claim {cl.id} states no formula")
    return cl.formula


@derivation("count-nierop")
def count_nierop() -> Derivation:
    cl = claim("count-nierop")
    assert cl.claimed_percent is not None  # the claim states its percentages
    expr = parse_formula(_formula(cl))
    n_t, n_h, d_h, d_e = (sp.Symbol(s, positive=True) for s in ("n_t", "n_h", "d_h", "d_e"))
    paper = counts.nierop_redundancy(n_t, n_h, d_h, d_e)
    formula_matches = sp.simplify(expr - paper) == 0
    rows: list = []
    matched_rows: dict = {}
    for m in cl.params["models"]:
        vals = {k: m[k] for k in ("n_t", "n_h", "d_h", "d_e")}
        red = int(evaluate_formula(_formula(cl), vals))
        assert red == counts.nierop_redundancy(**vals)
        claimed_pct = cl.claimed_percent[m["row"] - 1]
        for total in m["totals"]:
            pct = sp.Rational(100 * red, total)
            rounded = round(float(pct), 1)
            match = abs(rounded - claimed_pct) < 1e-9
            corr = counts.corrected_count(_arch(m["arch"]))
            rows.append(
                dict(
                    row=m["row"],
                    name=m["name"],
                    params=total,
                    redundancy=red,
                    percent=float(pct),
                    rounded=rounded,
                    claimed=claimed_pct,
                    match=match,
                    corrected=corr.established,
                    corrected_with_conjectures=corr.total,
                )
            )
            if match:
                matched_rows.setdefault(m["row"], []).append(m["name"])
    reproduced = all(r in matched_rows for r in range(1, len(cl.claimed_percent) + 1))
    mismatch = [r for r in rows if r["match"] and r["redundancy"] != r["corrected"]]
    claimed_ok = formula_matches and reproduced and not mismatch
    seen = set()
    lines = []
    for r in rows:
        lines.append(
            f"{r['name']} with {r['params']:,} parameters: redundancy {r['redundancy']:,} = {r['percent']:.3f} % "
            f"→ {r['rounded']} % (claimed {r['claimed']} %){'  ✓' if r['match'] else ''}"
        )
    corr_lines = []
    for r in rows:
        if r["match"] and r["name"] not in seen:
            seen.add(r["name"])
            corr_lines.append(
                f"{r['name']}: formula {r['redundancy']:,} vs established corrected count "
                f"{r['corrected']:,} (with conjectures {r['corrected_with_conjectures']:,})"
            )
    llama = ", ".join(matched_rows.get(3, [])) or "none"
    steps = [
        f"Claim-file formula parsed with the restricted parser: {sp.sstr(expr)}; equals eq. (17) "
        f"2·n_t·n_h·d_h² + ½(d_e−1)(d_e−2): {formula_matches}.",
        *lines,
        f"Table 1 reproduced for every row: {reproduced}; the LLaMA row (0.3 %) matches {llama}.",
        "Corrected counts (gauge_audit.symbolic.counts.corrected_count): GPT-2 ties its embedding and unembedding and "
        "uses affine LayerNorm, so the stream rotation is not a symmetry; it has attention biases (key shift, value "
        "fold) and LayerNorm scale/shift freedoms; LLaMA uses RoPE (d_h per head, not d_h²), RMSNorm (SO(d_e)) and "
        "SwiGLU (d_ff scalings per layer).",
        *corr_lines,
    ]
    first = mismatch[0] if mismatch else None
    return Derivation(
        claim="count-nierop",
        title="van Nierop eq. (17) and Table 1",
        claimed=cl.statement,
        verdict=decide(claimed_ok),
        derived="; ".join(corr_lines) or "no row reproduced",
        residual=f"formula − corrected = {first['redundancy'] - first['corrected']:,} ({first['name']})"
        if first
        else "0",
        corrected_rule="use counts.corrected_count(config): " + "; ".join(corr_lines),
        counterexample=f"{first['name']}: eq. (17) gives {first['redundancy']:,}, established count {first['corrected']:,}"
        if first
        else None,
        steps=steps,
        data={
            "rows": rows,
            "table_reproduced": reproduced,
            "llama_match": matched_rows.get(3, []),
            "formula_matches_eq17": formula_matches,
        },
        exprs=[("eq. (17)", paper)],
    )


@derivation("count-transformer-base")
def count_transformer_base() -> Derivation:
    cl = claim("count-transformer-base")
    assert cl.claimed_value is not None  # the claim states its count
    p = dict(cl.params)
    value = int(evaluate_formula(_formula(cl), {k: p[k] for k in ("L", "h", "d_k", "d_v")}))
    model = counts.mgs_model_dim(p["L"], p["h"], p["d_k"], p["d_v"])
    corr = counts.corrected_count(_arch(p["arch"]))
    claimed_ok = (
        value == model
        and _relation_holds(value, cl.claimed_value, cl.relation)
        and _relation_holds(corr.established, cl.claimed_value, cl.relation)
    )
    steps = [
        f"G_Model = ∏_l G_Layer: Σ_l h(d_k² + d_v²) with L = {p['L']}, h = {p['h']}, d_k = d_v = {p['d_k']}: "
        f"{p['L']}·{p['h']}·({p['d_k']}² + {p['d_v']}²) = {value:,} (counts.mgs_model_dim: {model:,}).",
        f"Claim: over {cl.claimed_value:,} ({cl.relation}): {value:,} {cl.relation} {cl.claimed_value:,}: "
        f"{_relation_holds(value, cl.claimed_value, cl.relation)}; {value / p['params_total']:.2%} of "
        f"{p['params_total']:,} parameters.",
        f"Corrected count for {corr.config.name} (post-LN, biases, tied embeddings):\n{corr.table()}",
        "The attention GL part alone already exceeds 1.1 M; the corrected count adds bias shifts and stays above.",
    ]
    return Derivation(
        claim="count-transformer-base",
        title="Over 1.1 M redundant dimensions in Transformer-Base",
        claimed=cl.statement,
        verdict=decide(claimed_ok),
        derived=f"L·h·(d_k²+d_v²) = {value:,}; established corrected count {corr.established:,}",
        residual=f"{value:,} − {cl.claimed_value:,} = {value - cl.claimed_value:,} (≥ 0 required)",
        steps=steps,
        data={"value": value, "corrected": corr.as_dict(), "corrected_established": corr.established},
        exprs=[("count", parse_formula(_formula(cl)))],
    )


@derivation("count-wiki-log-hfact")
def count_wiki_log_hfact() -> Derivation:
    cl = claim("count-wiki-log-hfact")
    expr = parse_formula(_formula(cl))
    h, dk, dv = (sp.Symbol(s, positive=True) for s in ("h", "d_k", "d_v"))
    derived = counts.mgs_layer_dim(h, dk, dv)
    resid = sp.simplify(expr - derived)
    lie = {hh: attention_symmetry_dim(hh, hh, 4, 2, 2, seed=6).dimension for hh in (2, 3)}
    wiki_vals = {hh: expr.subs({h: hh, dk: 2, dv: 2}) for hh in lie}
    p = dict(cl.params)
    at = expr.subs({h: p["h"], dk: p["d_k"], dv: p["d_v"]})
    claimed_ok = resid == 0
    steps = [
        f"Wiki §10.2 formula (parsed): {sp.sstr(expr)}.",
        "S_h is a finite group: its Lie algebra is 0, so it adds no dimension (dim of a finite group = 0, and "
        "log|S_h| is a measure of size, not a dimension).",
        f"Exact Lie-algebra dimension of one MHA layer (d_model=4, d_k=d_v=2): {lie}; wiki formula gives "
        f"{ {k: sp.sstr(v) for k, v in wiki_vals.items()} } — not even an integer.",
        f"Residual wiki − derived = {resid}; at h = {p['h']}, d_k = d_v = {p['d_k']}: {sp.sstr(at)} ≈ {sp.N(at, 8)}.",
    ]
    return Derivation(
        claim="count-wiki-log-hfact",
        title="dim G_max = h(d_k²+d_v²) + log(h!)",
        claimed=cl.statement,
        verdict=decide(claimed_ok, True),
        derived=derived,
        residual=resid,
        corrected_rule="dim G_max = h(d_k² + d_v²) (S_h adds nothing)",
        counterexample=f"h = 2, d_k = d_v = 2: exact dimension {lie[2]}, formula {sp.sstr(wiki_vals[2])}",
        steps=steps,
        data={"lie": lie, "residual": sp.sstr(resid)},
        exprs=[("wiki", expr), ("derived", derived), ("residual", resid)],
    )


@derivation("count-wiki-attn-params")
def count_wiki_attn_params() -> Derivation:
    cl = claim("count-wiki-attn-params")
    p = dict(cl.params)
    weights = counts.attention_param_count(p["L"], p["d_model"], p["h"], p["d_k"])
    biases = p["L"] * 4 * p["d_model"]
    ok = _relation_holds(weights + biases, cl.claimed_value, cl.relation)
    table_rows = {k: p["L"] * p["d_model"] * p["h"] * p["d_k"] for k in ("W_Q", "W_K", "W_V", "W_O")}
    steps = [
        f"Per matrix 12 × 768 × 64 in the wiki's table: {table_rows['W_Q']:,} each; four matrices: {weights:,}; "
        f"with biases {weights + biases:,}.",
        f"Claimed ≈ {cl.claimed_value:,} ({cl.relation}, within 5 %): {ok}.",
        "The wiki's per-matrix redundancy split (300K/300K/250K/250K) is also asymmetric although d_k = d_v: the GL "
        f"parts are L·h·d_k² = {p['L'] * p['h'] * p['d_k'] ** 2:,} for QK and the same for VO.",
    ]
    return Derivation(
        claim="count-wiki-attn-params",
        title="~44 M attention parameters in the 110 M model",
        claimed=cl.statement,
        verdict=decide(ok),
        derived=f"{weights + biases:,} attention parameters",
        residual=f"{cl.claimed_value:,} − {weights + biases:,} = {cl.claimed_value - weights - biases:,}",
        corrected_rule=f"≈ {round((weights + biases) / 1e6, 1)} M attention parameters",
        steps=steps,
        data={"weights": weights, "biases": biases},
    )


@derivation("count-wiki-dim-theta")
def count_wiki_dim_theta() -> Derivation:
    cl = claim("count-wiki-dim-theta")
    expr = parse_formula(_formula(cl))
    h, dk, dv, dm = (sp.Symbol(s, positive=True) for s in ("h", "d_k", "d_v", "d_model"))
    actual = h * dm * dk + h * dm * dk + h * dm * dv + h * dv * dm  # W_Q, W_K, W_V, W_O per head
    resid = sp.factor(expr - actual)
    check = counts.attention_param_count(1, 768, 12, 64)
    steps = [
        f"Wiki: dim Θ = {sp.sstr(expr)}.",
        f"Per head W_Q, W_K: d_model·d_k each; W_V: d_model·d_v; W_O: d_v·d_model → {sp.sstr(sp.factor(actual))} "
        f"(one GPT-2 layer: {check:,}).",
        f"Residual: {resid} — the formula double counts.",
    ]
    return Derivation(
        claim="count-wiki-dim-theta",
        title="dim Θ = 4h(d_k+d_v)·d_model",
        claimed=cl.statement,
        verdict=decide(resid == 0),
        derived=sp.factor(actual),
        residual=resid,
        corrected_rule="dim Θ = 2h(d_k + d_v)·d_model (per layer, no biases)",
        steps=steps,
        exprs=[("wiki", expr), ("actual", actual), ("residual", resid)],
    )


@derivation("fdof-bound")
def fdof_bound() -> Derivation:
    cl = claim("fdof-bound")
    p = dict(cl.params)
    P = p["P"]
    bound = parse_formula(_formula(cl)).subs(sp.Symbol("P", positive=True), P)
    own = P - p["redundant"]
    corr = counts.corrected_count(_arch(p["arch"]))
    ours = P - corr.total
    ok = bool(own <= bound) and bool(ours <= bound)
    frac = 1 - 1 / sp.log(P)
    steps = [
        f"Bound: fdof ≤ P/log P = {sp.sstr(bound)} ≈ {float(bound):,.0f} for P = {P:,}: at least "
        f"{float(frac):.1%} of the parameters would have to be redundant.",
        f"With the document's own figure ({p['redundant']:,} redundant dimensions) fdof = P − {p['redundant']:,} = "
        f"{own:,} > {float(bound):,.0f}.",
        f"With our corrected count incl. conjectures for {corr.config.name} ({corr.total:,}): fdof ≈ {ours:,}.",
        "Per layer the attention symmetries are ≈ 2h·d_k² out of ≈ 12·d_model² parameters, a fixed fraction 1/(6h): "
        "no symmetry count approaches 1 − 1/log P. (Degeneracies beyond symmetries would have to supply the rest; "
        "the nullity audit measures the actual Jacobian rank.)",
    ]
    return Derivation(
        claim="fdof-bound",
        title="fdof ≤ P / log P",
        claimed=cl.statement,
        verdict=decide(ok),
        derived=f"fdof = P − dim(symmetries) ≈ {ours:,} for {corr.config.name}",
        residual=f"fdof − P/log P ≈ {own - float(bound):,.0f} (document's own count)",
        counterexample=f"P = {P:,}: document's own redundancy gives fdof = {own:,} > P/log P ≈ {float(bound):,.0f}",
        steps=steps,
        data={"bound": float(bound), "fdof_own": own, "fdof_corrected": ours},
    )


@derivation("maximality-model")
def maximality_model() -> Derivation:
    cl = claim("maximality-model")
    rows: list[dict[str, Any]] = []
    for name in cl.params["archs"]:
        cfg = _arch(name)
        corr = counts.corrected_count(cfg)
        layer_product = corr.as_dict()["attn_qk"] + corr.as_dict()["attn_vo"]
        extra = {
            c.name: c.value
            for c in corr.components
            if c.status == counts.ESTABLISHED and c.name not in ("attn_qk", "attn_vo") and c.value
        }
        rows.append(dict(arch=cfg.name, product=layer_product, established=corr.established, extra=extra))
    ok = all(not r["extra"] for r in rows)
    steps = [
        "G_Model = ∏_l G_Layer counts only attention-internal transforms.",
        *[
            f"{r['arch']}: ∏ G_Layer has dimension {r['product']:,}; established corrected count {r['established']:,}; "
            f"symmetries outside the product: {r['extra']}"
            for r in rows
        ],
        "Each extra component is derived in this module: SwiGLU/ReLU scaling (relu-forces-identity), stream rotation "
        "(ln-affine-rotation / rmsnorm-rotation), norm scale, bias shifts.",
    ]
    r0 = next((r for r in rows if r["extra"]), rows[0])
    return Derivation(
        claim="maximality-model",
        title="Full-model group = product of layer groups",
        claimed=cl.statement,
        verdict=decide(ok),
        derived="; ".join(f"{r['arch']}: {r['established']:,}" for r in rows),
        residual=f"{r0['arch']}: {r0['established'] - r0['product']:,} extra dimensions",
        counterexample=f"{r0['arch']}: {r0['extra']}",
        corrected_rule="G_Model ⊋ ∏ G_Layer: add the components of counts.corrected_count",
        steps=steps,
        data={"rows": rows},
    )
