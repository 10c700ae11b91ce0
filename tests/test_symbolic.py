"""One test per SymPy derivation: derived rules, non-zero residuals of false rules, computed dimensions."""

from __future__ import annotations

import pytest
import sympy as sp

from gauge_audit.symbolic import DERIVATIONS, FAILS, HOLDS, HOLDS_WITH_CORRECTION, attention, counts, derive, nierop
from gauge_audit.symbolic.lie import PYTHAGOREAN, attention_symmetry_dim, commutant_dim, rope_matrix
from gauge_audit.symbolic.registry import coefficient_equations, sym_matrix


def test_registry_names_match_ids():
    for cid, fn in DERIVATIONS.items():
        assert fn.__name__ == cid.replace("-", "_")


def test_package_exports_every_derivation():
    import gauge_audit.symbolic as package

    for cid, fn in DERIVATIONS.items():
        name = cid.replace("-", "_")
        assert name in package.__all__ and getattr(package, name) is fn, cid


def test_qk_gl_identity_and_solved_partner():
    r = derive("qk-gl")
    assert r.verdict == HOLDS and r.residual == "0"
    m = sym_matrix("m", 2, 2)
    assert sp.simplify(sp.Matrix(sp.sympify(r.data["solved_partner"])) - m.inv().T) == sp.zeros(2, 2)
    assert r.data["lie_dimension"] == 16


def test_qk_same_action_residual_is_mmt_minus_i():
    r = derive("qk-same-action")
    assert r.verdict == FAILS
    S = attention.SCORES
    resid = sp.expand((attention.X * attention.WQ * attention.M) * (attention.X * attention.WK * attention.M).T - S)
    fact = (
        attention.X
        * attention.WQ
        * (attention.M * attention.M.T - sp.Identity(attention.k))
        * attention.WK.T
        * attention.X.T
    )
    diff = (sp.expand(fact) - resid).doit()
    assert diff == 0 or isinstance(diff, sp.ZeroMatrix)
    assert resid.doit() != 0
    assert "checked by expansion: True" in r.steps[1]
    assert r.data["counterexample_residual"] != 0
    assert "M·Mᵀ = I" in r.derived


def test_qk_orthogonal_only_counterexample():
    r = derive("qk-orthogonal-only")
    assert r.verdict == FAILS
    assert r.data["qk_lie_dimension"] == 8 and r.data["orthogonal_dimension"] == 2
    assert r.residual == "Matrix([[0]])"


def test_vo_gl_solved_inverse():
    r = derive("vo-gl")
    assert r.verdict == HOLDS and r.residual == "0"
    n = sym_matrix("n", 2, 2)
    assert sp.simplify(sp.Matrix(sp.sympify(r.data["solved_partner"])) - n.inv()) == sp.zeros(2, 2)


def test_head_perm_residual_zero():
    r = derive("head-perm")
    assert r.verdict == HOLDS and r.residual == "0" and r.data["group_dimension"] == 0


def test_moe_expert_perm():
    r = derive("moe-expert-perm")
    assert r.verdict == HOLDS and r.residual == "0"


def test_moe_routing():
    r = derive("moe-routing")
    assert r.verdict == HOLDS and r.residual == "0"


def test_value_g3_eq_g0_solved_inverse():
    r = derive("value-g3-eq-g0")
    assert r.verdict == FAILS
    a = sym_matrix("a", 2, 2)
    solved = sp.Matrix(sp.sympify(r.data["solved_g3"]))
    assert sp.simplify(solved - a.inv()) == sp.zeros(2, 2)
    assert r.derived == "g(3) = g(0)^-1"
    assert r.data["claimed_residual_zero"] is False
    # the claimed rule leaves V (g0² − I) Ē: zero iff g0² = I
    V, E = sym_matrix("v", 2, 3), sym_matrix("e", 3, 1)
    assert any(x != 0 for x in sp.expand(V * nierop.CYCLIC**2 * E - V * E))
    flip = sp.Matrix([[1, 0, 0], [0, 0, 1], [0, 1, 0]])  # an involution: g² = I
    assert all(x == 0 for x in sp.expand(V * flip**2 * E - V * E))


def test_nierop_eq14_transpose_conditions():
    r = derive("nierop-eq14-transpose")
    assert r.verdict == HOLDS_WITH_CORRECTION
    d = r.data
    assert d["eq9_reading_derived_inverse"] and not d["eq9_reading_printed_holds"]
    assert d["eq2_reading_printed_holds"] and d["h_condition_holds"]
    assert d["residual_printed_eq9"] != "0" and d["residual_corrected_eq9"] == "0" and d["residual_printed_eq2"] == "0"


def test_ln_noaffine_rotation_dimension():
    r = derive("ln-noaffine-rotation")
    assert r.verdict == HOLDS
    assert r.data["so_dimension"] == {3: 1, 4: 3}
    assert r.data["gl_dimension_d4"] == 3 + 1  # so(3) ⊕ span(1·1ᵀ)


def test_rmsnorm_rotation_dimension():
    r = derive("rmsnorm-rotation")
    assert r.verdict == HOLDS_WITH_CORRECTION
    assert r.data["so_dimension"] == {3: 3, 4: 6}
    assert r.data["gl_dimension"] == {3: 3, 4: 6}


def test_ln_affine_rotation_corrected_rule():
    r = derive("ln-affine-rotation")
    assert r.verdict == HOLDS_WITH_CORRECTION
    d = r.data
    assert d["paper_rule_dimension"] == 0 and d["rotation_dimension"] == 3 and d["constant_gamma_dimension"] == 3
    assert d["tied_dimension_generic_gamma"] == 0 and d["tied_dimension_constant_gamma"] == 3
    assert d["corrected_residual_zero"] is True
    assert "W' = W·diag(γ)·g^-1·diag(γ)^-1" in r.derived


def test_ln_reviewer_no_fix_gamma_beta_unsolvable():
    r = derive("ln-reviewer-no-fix")
    assert r.verdict == HOLDS_WITH_CORRECTION
    assert r.data["gamma_beta_solutions_generic"] == 0
    assert r.data["gamma_beta_solutions_constant"] == 1 and r.data["gamma_beta_solutions_permutation"] == 1
    assert r.data["restored_by_readers"] is True


def test_relu_forces_identity_homogeneity():
    r = derive("relu-forces-identity")
    assert r.verdict == FAILS
    assert r.data["scaling_dimension"] == {"relu": 3, "gelu": 0, "silu": 0}
    assert abs(float(r.data["gelu_residual"])) > 1e-3


def test_rope_commutant_solved_and_dimensions():
    r = derive("rope-commutant")
    assert r.verdict == HOLDS
    assert r.data["commutant_2_planes"] == 4 and r.data["commutant_3_planes"] == 6
    assert r.data["commutant_coinciding"] == 8
    assert r.data["layer_dimension"] == r.data["mgs"] == counts.mgs_rope_layer_dim(2, 4, 2) == 16
    assert r.data["layer_dimension_coinciding"] == 24
    A = r.exprs[0][1]
    assert A[0, 0] == A[1, 1] and A[0, 1] == -A[1, 0]


def test_maximality_lie_dimension():
    r = derive("maximality")
    assert r.verdict == HOLDS
    for case in r.data["cases"]:
        assert case["dimension"] == case["formula"] == case["h"] * (case["d_k"] ** 2 + case["d_v"] ** 2)


def test_maximality_model_extra_components():
    r = derive("maximality-model")
    assert r.verdict == FAILS
    llama = r.data["rows"][0]
    assert llama["extra"]["ffn_scaling"] == 32 * 11008 and llama["extra"]["stream_rotation"] == 4096 * 4095 // 2


def test_gqa_tied_dimensions():
    r = derive("gqa-tied")
    assert r.verdict == HOLDS
    dims = {(c["n_q"], c["n_kv"], c["rope"]): c["dimension"] for c in r.data["cases"]}
    assert dims == {(4, 2, False): 16, (4, 1, False): 8, (2, 1, True): 8}


def test_gqa_wiki_formula_residual():
    r = derive("gqa-wiki-formula")
    assert r.verdict == FAILS
    nq, nkv, dk = sp.symbols("n_q n_kv d_k", positive=True, integer=True)
    assert sp.simplify(sp.sympify(r.residual, locals={"n_q": nq, "n_kv": nkv, "d_k": dk}) - dk**2 * (nq - nkv)) == 0
    assert r.data["cases"][0]["wiki"] == 24 and r.data["cases"][0]["dimension"] == 16


def test_count_nierop_table1_reproduction():
    r = derive("count-nierop")
    assert r.verdict == FAILS
    assert r.data["formula_matches_eq17"] and r.data["table_reproduced"]
    assert r.data["llama_match"] == ["LLaMA-65B"]
    red = {row["name"]: row["redundancy"] for row in r.data["rows"]}
    assert red["GPT-2"] == 1473409 and red["GPT-2-XL"] == 11108001 and red["LLaMA-65B"] == 201314305
    ok = {(row["name"], row["params"]) for row in r.data["rows"] if row["match"]}
    assert ("GPT-2", 117000000) in ok and ("GPT-2", 124439808) not in ok
    assert ("GPT-2-XL", 1500000000) in ok and ("GPT-2-XL", 1557611200) in ok
    gpt2 = next(row for row in r.data["rows"] if row["name"] == "GPT-2")
    assert gpt2["corrected"] == counts.corrected_count(counts.GPT2_SMALL).established == 1346584


def test_count_transformer_base_over_1_1m():
    r = derive("count-transformer-base")
    assert r.verdict == HOLDS
    assert r.data["value"] == 1179648 == counts.mgs_model_dim(12, 12, 64, 64)
    assert r.data["corrected_established"] == 1179648 + 2 * 12 * 12 * 64


def test_count_wiki_log_hfact_residual():
    r = derive("count-wiki-log-hfact")
    assert r.verdict == FAILS
    h = sp.Symbol("h", positive=True)
    assert sp.simplify(sp.sympify(r.residual, locals={"h": h}) - sp.log(sp.factorial(h))) == 0
    assert r.data["lie"] == {2: 16, 3: 24}


def test_count_wiki_attn_params():
    r = derive("count-wiki-attn-params")
    assert r.verdict == FAILS and r.data["weights"] == 4 * 12 * 768 * 768


def test_count_wiki_dim_theta():
    r = derive("count-wiki-dim-theta")
    assert r.verdict == FAILS
    h, dk, dv, dm = sp.symbols("h d_k d_v d_model", positive=True)
    assert (
        sp.simplify(sp.sympify(r.residual, locals=dict(h=h, d_k=dk, d_v=dv, d_model=dm)) - 2 * h * dm * (dk + dv)) == 0
    )


def test_fdof_bound():
    r = derive("fdof-bound")
    assert r.verdict == FAILS
    assert r.data["fdof_own"] == 110000000 - 1100000 > r.data["bound"]


def test_counts_paper_formulas_plain_ints():
    assert counts.nierop_redundancy(12, 12, 64, 768) == 1473409
    assert counts.mgs_layer_dim(12, 64, 64) == 98304
    assert counts.mgs_rope_layer_dim(32, 128, 128) == 32 * (128 + 128**2)
    assert counts.mgs_gqa_layer_dim(4, 64, 64) == 4 * 8192
    assert counts.wiki_gqa_layer_dim(12, 4, 64, 64) == 12 * 4096 + 4 * 4096
    assert counts.wiki_param_dim(12, 64, 64, 768) == 2 * counts.attention_param_count(1, 768, 12, 64)
    assert counts.wiki_group_dim(2, 2, 2) == 16 + sp.log(2)
    n_t, n_h, d_h, d_e = counts.symbols("n_t", "n_h", "d_h", "d_e")
    assert (
        sp.expand(counts.nierop_redundancy(n_t, n_h, d_h, d_e) - (2 * n_t * n_h * d_h**2 + (d_e - 1) * (d_e - 2) / 2))
        == 0
    )


def test_counts_corrected_components():
    llama = counts.corrected_count(counts.LLAMA["7B"]).as_dict()
    assert llama["attn_qk"] == 32 * 32 * 128 and llama["attn_vo"] == 32 * 32 * 128**2
    assert llama["stream_rotation"] == 4096 * 4095 // 2 and llama["ffn_scaling"] == 32 * 11008
    gqa = counts.corrected_count(counts.LLAMA["7B"].with_(n_kv_heads=8)).as_dict()
    assert gqa["attn_qk"] == 32 * 8 * 128
    gpt2 = counts.corrected_count(counts.GPT2_SMALL).as_dict()
    assert gpt2["stream_rotation"] == 0  # tied embeddings + affine final LayerNorm
    untied = counts.corrected_count(counts.GPT2_SMALL.with_(tied_embeddings=False)).as_dict()
    assert untied["stream_rotation"] == 767 * 766 // 2
    # 1 179 648 (QK, VO) + 18 432 (key/value bias) + 2·18 432 (norm scale, shift) + 64 512 (reader-ones)
    # + 47 128 (writer-ones); equal to the measured nullity at small size (tests/test_counts_vs_nullity.py)
    assert counts.corrected_count(counts.GPT2_SMALL).established == 1346584


def test_lie_dimension_matches_formulas_small():
    assert attention_symmetry_dim(2, 2, 4, 2, 2, seed=11).dimension == counts.mgs_layer_dim(2, 2, 2)
    assert attention_symmetry_dim(4, 2, 4, 2, 2, seed=11).dimension == counts.mgs_gqa_layer_dim(2, 2, 2)
    assert commutant_dim([rope_matrix([PYTHAGOREAN[1]], 1)]) == 2


def test_coefficient_equations_helper():
    g = sym_matrix("g", 2, 2)
    v = sym_matrix("v", 1, 2)
    eqs = coefficient_equations(v * g - v, list(v))
    sol = sp.solve(eqs, list(g), dict=True)
    assert g.subs(sol[0]) == sp.eye(2)


@pytest.mark.parametrize("cid", sorted(DERIVATIONS))
def test_every_derivation_renders(cid):
    r = derive(cid)
    text = r.render()
    assert f"Verdict: {r.verdict}" in text and "1. " in text
    assert r.to_dict()["claim"] == cid
    assert r.latex.startswith("%")
