"""Lie-algebra dimensions: maximality, RoPE commutant, GQA/MQA (exact ranks over ℚ)."""

from __future__ import annotations

import sympy as sp

from . import counts
from .lie import PYTHAGOREAN, attention_symmetry_dim, commutant_dim, rope_matrix
from .registry import claim, derivation, sym_matrix
from .result import Derivation, decide


@derivation("maximality")
def maximality() -> Derivation:
    cl = claim("maximality")
    cases = [(2, 4, 2, 2), (3, 4, 2, 2), (2, 5, 2, 3)]
    rows = []
    for h, dm, dk, dv in cases:
        lie = attention_symmetry_dim(h, h, dm, dk, dv, seed=3)
        rows.append((h, dm, dk, dv, lie.dimension, counts.mgs_layer_dim(h, dk, dv), lie.unknowns, lie.rank))
    ok = all(r[4] == r[5] for r in rows)
    steps = [
        "Linearise θ ↦ (W_Q^i·W_K^iᵀ, W_V^i·W_O^i)_i at random rational weights (generic stratum) and compute the "
        "kernel of the Jacobian exactly over ℚ.",
        *[
            f"h={h}, d_model={dm}, d_k={dk}, d_v={dv}: {unk} parameters, rank {rk}, kernel {dim}; h(d_k²+d_v²) = {f}"
            for h, dm, dk, dv, dim, f, unk, rk in rows
        ],
        "So 𝔤 = ⊕ gl(d_k) ⊕ ⊕ gl(d_v) at the infinitesimal level; the discrete part (S_h) and the reduction "
        "'function determines the per-head products' (MGS's attention-controllability step) are checked numerically "
        "by the nullity and torch checkers, not here.",
    ]
    return Derivation(
        claim="maximality",
        title="Maximality of G_max (Lie algebra of one MHA layer)",
        claimed=cl.statement,
        verdict=decide(ok),
        derived="dim 𝔤 = h(d_k² + d_v²) at generic weights",
        residual=str([r[4] - r[5] for r in rows]),
        steps=steps,
        data={"cases": [dict(h=r[0], d_model=r[1], d_k=r[2], d_v=r[3], dimension=r[4], formula=r[5]) for r in rows]},
    )


def _gqa_rows(seed=4):
    out = []
    for n_q, n_kv, rope in [(4, 2, False), (4, 1, False), (2, 1, True)]:
        dk = 4 if rope else 2
        planes = PYTHAGOREAN[: dk // 2] if rope else None
        lie = attention_symmetry_dim(n_q, n_kv, 5 if rope else 4, dk, 2, rope_planes=planes, offsets=3, seed=seed)
        out.append(
            dict(
                n_q=n_q,
                n_kv=n_kv,
                d_k=dk,
                d_v=2,
                rope=rope,
                dimension=lie.dimension,
                mgs=counts.mgs_gqa_layer_dim(n_kv, dk, 2, rope=rope),
                wiki=counts.wiki_gqa_layer_dim(n_q, n_kv, dk, 2),
            )
        )
    return out


@derivation("gqa-tied")
def gqa_tied() -> Derivation:
    cl = claim("gqa-tied")
    rows = _gqa_rows()
    ok = all(r["dimension"] == r["mgs"] for r in rows)
    steps = [
        "GQA: query head i shares W_K, W_V with its K/V group; the constraints are W_Q^i·R_r·W_K^{g(i)ᵀ} and "
        "W_V^{g(i)}·W_O^i for every query head.",
        *[
            f"n_q={r['n_q']}, n_kv={r['n_kv']}, d_k={r['d_k']}, d_v={r['d_v']}{', RoPE' if r['rope'] else ''}: "
            f"exact kernel dimension {r['dimension']}; MGS g(d_k²+d_v²){' (RoPE: g(d_k+d_v²))' if r['rope'] else ''} = "
            f"{r['mgs']}"
            for r in rows
        ],
        "A query head cannot have its own M: the shared W_K forces one M per group (and one N per shared W_V).",
    ]
    return Derivation(
        claim="gqa-tied",
        title="GQA/MQA: transforms tied per K/V group",
        claimed=cl.statement,
        verdict=decide(ok),
        derived="dim = n_kv·(d_k² + d_v²)  (RoPE: n_kv·(d_k + d_v²))",
        residual=str([r["dimension"] - r["mgs"] for r in rows]),
        steps=steps,
        data={"cases": rows},
    )


@derivation("gqa-wiki-formula")
def gqa_wiki_formula() -> Derivation:
    cl = claim("gqa-wiki-formula")
    rows = [r for r in _gqa_rows() if not r["rope"]]
    claimed_ok = all(r["dimension"] == r["wiki"] for r in rows)
    corrected_ok = all(r["dimension"] == r["mgs"] for r in rows)
    nq, nkv, dk, dv = sp.symbols("n_q n_kv d_k d_v", positive=True, integer=True)
    resid = sp.factor(counts.wiki_gqa_layer_dim(nq, nkv, dk, dv) - counts.mgs_gqa_layer_dim(nkv, dk, dv))
    table = {
        f"{q}:{kv}": (counts.wiki_gqa_layer_dim(q, kv, 64, 64), counts.mgs_gqa_layer_dim(kv, 64, 64))
        for q, kv in [(12, 12), (12, 4), (12, 1)]
    }
    steps = [
        "Wiki §7: G_GQA = (GL(d_k))^{n_query} × (GL(d_v))^{n_kv}, table: 12:4 → 12·d_k² + 4·d_v².",
        *[
            f"n_q={r['n_q']}, n_kv={r['n_kv']}, d_k=d_v=2: exact dimension {r['dimension']}, wiki formula {r['wiki']}, "
            f"n_kv(d_k²+d_v²) = {r['mgs']}"
            for r in rows
        ],
        f"Symbolic difference wiki − derived = {resid}: the query side is tied per group too.",
        f"Wiki table at d_k = d_v = 64 (wiki, derived): {table}.",
    ]
    return Derivation(
        claim="gqa-wiki-formula",
        title="Wiki GQA dimension n_q·d_k² + n_kv·d_v²",
        claimed=cl.statement,
        verdict=decide(claimed_ok, corrected_ok),
        derived="dim = n_kv·(d_k² + d_v²)",
        residual=resid,
        corrected_rule="n_kv·(d_k² + d_v²) per layer (n_kv·(d_k + d_v²) with RoPE)",
        counterexample=f"n_q=4, n_kv=2, d_k=d_v=2: wiki {rows[0]['wiki']}, exact {rows[0]['dimension']}",
        steps=steps,
        data={"cases": rows, "table_d64": table},
        exprs=[("difference", resid)],
    )


@derivation("rope-commutant")
def rope_commutant() -> Derivation:
    cl = claim("rope-commutant")
    cs, sn = sp.symbols("c s", real=True)
    R = sp.Matrix([[cs, -sn], [sn, cs]])
    A = sym_matrix("a", 2, 2)
    sol = sp.solve(list(A * R - R * A), list(A), dict=True)
    solved = A.subs(sol[0]) if sol else None
    assert solved is not None  # A = 0 commutes with R: the solution set is never empty
    J = sp.Matrix([[0, -1], [1, 0]])
    a, b = solved[0, 0], solved[1, 0]
    form_ok = sp.simplify(solved - (a * sp.eye(2) + b * J)) == sp.zeros(2, 2)
    # two frequency planes: off-diagonal block X with X·R(θ2) = R(θ1)·X
    c1, s1, c2, s2 = sp.symbols("c1 s1 c2 s2", real=True)
    R1, R2 = sp.Matrix([[c1, -s1], [s1, c1]]), sp.Matrix([[c2, -s2], [s2, c2]])
    Xb = sym_matrix("x", 2, 2)
    system, _ = sp.linear_eq_to_matrix(list(Xb * R2 - R1 * Xb), list(Xb))
    det = sp.factor(system.det())
    # exact dimensions with rational points on the circle
    dist = commutant_dim([rope_matrix(PYTHAGOREAN[:2], 1)])
    three = commutant_dim([rope_matrix(PYTHAGOREAN[:3], 1)])
    same = commutant_dim([rope_matrix([PYTHAGOREAN[0]] * 2, 1)])
    lie = attention_symmetry_dim(2, 2, 5, 4, 2, rope_planes=PYTHAGOREAN[:2], offsets=3, seed=5)
    lie_same = attention_symmetry_dim(2, 2, 5, 4, 2, rope_planes=[PYTHAGOREAN[0]] * 2, offsets=3, seed=5)
    mgs = counts.mgs_rope_layer_dim(2, 4, 2)
    ok = form_ok and dist == 4 and three == 6 and lie.dimension == mgs
    steps = [
        f"One plane: solve A·R(θ) = R(θ)·A (c = cos θ, s = sin θ symbolic, generic s ≠ 0): A = {sp.sstr(solved)} "
        f"= a·I + b·J: {form_ok} — GL(1,ℂ), 2 real dimensions.",
        f"Two planes, off-diagonal block X·R(θ₂) = R(θ₁)·X: determinant of the 4×4 system = {det}; it vanishes only "
        "when e^{±iθ₁} = e^{±iθ₂} (coinciding frequencies, up to sign), otherwise X = 0 and A is block diagonal.",
        f"Exact commutant dimensions (rational points on the circle): 2 distinct planes {dist}, 3 distinct planes "
        f"{three} (= d_k); 2 coinciding planes {same} (= gl(2,ℂ), 8 real dimensions).",
        f"Whole layer with RoPE (h=2, d_model=5, d_k=4, d_v=2, offsets 0..2): exact dimension {lie.dimension}; "
        f"MGS h·(d_k + d_v²) = {mgs}. With coinciding frequencies: {lie_same}.",
    ]
    return Derivation(
        claim="rope-commutant",
        title="RoPE commutant GL(1,ℂ)^{d_k/2}",
        claimed=cl.statement,
        verdict=decide(ok),
        derived="A = a·I + b·J per plane; block diagonal for distinct frequencies; d_k real dims per head",
        residual=sp.sstr(sp.simplify(solved * R - R * solved)),
        steps=steps,
        data={
            "commutant_2_planes": dist,
            "commutant_3_planes": three,
            "commutant_coinciding": same,
            "layer_dimension": lie.dimension,
            "layer_dimension_coinciding": lie_same.dimension,
            "mgs": mgs,
            "offdiag_determinant": sp.sstr(det),
        },
        exprs=[("A", solved), ("off-diagonal determinant", det)],
    )
