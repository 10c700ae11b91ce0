"""The symbolic, precision and nullity checkers on rules: decisions, solved corrections, conditions,
certificates, generators."""

from __future__ import annotations

import dataclasses

import pytest

from gauge_audit.audit.nullity_checks import configs
from gauge_audit.claims.rule import parse_rule
from gauge_audit.models import config_of
from gauge_audit.nullity import analyze
from gauge_audit.nullity.explain import span_rank
from gauge_audit.rules import nullity as rn
from gauge_audit.rules import precision as rp
from gauge_audit.rules import symbolic as rs
from gauge_audit.rules.engine import NotApplicable
from rule_tables import PAPER, QK, READERS, SAME, WRITERS

VO_DIAG = {
    "scope": "head",
    "elements": {"s": "diagonal(d_v)"},
    "maps": {"W_V": "W_V @ diag(s)", "b_V": "b_V @ diag(s)", "W_O": "inv(diag(s)) @ W_O"},
}
G3 = {"scope": "model", "elements": {"R": "SO(d_model)"}, "maps": {**WRITERS, **READERS, "W_V": "R @ W_V"}}
RELU = {
    "scope": "layer",
    "elements": {"s": "positive-diagonal(d_ff)"},
    "maps": {"W_in": "W_in @ diag(s)", "b_in": "b_in @ diag(s)", "W_out": "inv(diag(s)) @ W_out"},
}
GATE = {
    "scope": "layer",
    "elements": {"s": "positive-diagonal(d_ff)"},
    "maps": {"W_gate": "W_gate @ diag(s)", "W_out": "inv(diag(s)) @ W_out"},
}
SHIFT = {"scope": "head", "elements": {"c": "translation(d_v)"}, "maps": {"b_V": "b_V + c"}}


def _sym(table, *models):
    return rs.check(parse_rule(table), [config_of(m) for m in models])


# ----------------------------------------------------------------------------- symbolic
def test_qk_gl_rule_symbolic_holds_on_every_attention_class():
    r = _sym(QK, "attn-tiny", "attn-tiny-gqa", "gpt2-tiny", "bert-tiny")
    assert r.verdict_holds and rs.quantities(r.per_arch) == {
        "attention scores": True,
        "attention output": True,
        "block output": True,
    }
    assert len({a["arch"] for a in r.per_arch}) >= 3 and r.corrected is None


def test_qk_same_action_rule_symbolic_solves_the_key_partner_and_the_condition():
    r = _sym(SAME, "attn-tiny")
    assert not r.verdict_holds and not rs.quantities(r.per_arch)["attention scores"]
    assert r.corrected_text == "W_K ↦ W_K @ inv(transpose(M))"  # solved, not looked up
    assert r.condition.startswith("holds only for M ∈ O(d_k)")
    assert "attention scores" in r.counterexample and "off by" in r.counterexample


def test_value_g3_eq_g0_rule_symbolic_derives_the_inverse():
    r = _sym(G3, "llama-tiny-noweight")
    q = rs.quantities(r.per_arch)
    assert q["attention scores"] and not q["attention output"]  # only the value path breaks
    assert r.corrected_text == "W_V ↦ transpose(R) @ W_V"  # g(3) = g(0)⁻¹ = g(0)ᵀ
    assert "R² = I" in r.condition


def test_ln_affine_rotation_rule_symbolic_derives_the_conjugated_reader_rule():
    r = _sym(PAPER, "gpt2-tiny")
    assert not r.verdict_holds
    for norm, readers in (("norm1", ("W_Q", "W_K", "W_V")), ("norm2", ("W_in",)), ("norm_f", ("W_U",))):
        conj = f"inv(diag({norm}.w)) @ transpose(R) @ diag({norm}.w)"
        for w in readers:
            assert r.corrected.map_of(w).text == f"{conj} @ {w}"
        assert r.corrected.map_of(f"{norm}.b").text == f"{norm}.b @ inv(diag({norm}.w)) @ R @ diag({norm}.w)"
    # the same rule without γ, β holds as stated
    assert _sym(PAPER, "gpt2-tiny-noaffine", "llama-tiny-noweight").verdict_holds


def test_relu_forces_identity_rule_symbolic_activation_homogeneity():
    assert _sym(RELU, "gpt2-tiny-relu", "llama-tiny").verdict_holds  # ReLU, and SwiGLU's linear up-projection
    r = _sym(RELU, "gpt2-tiny")
    assert not r.verdict_holds and r.corrected is None and "gelu" in r.counterexample
    g = _sym(GATE, "llama-tiny")
    assert not g.verdict_holds and any("silu" in it["name"] for a in g.per_arch for it in a["interfaces"])


def test_rule_symbolic_solves_a_parameter_dependent_increment():
    r = _sym(SHIFT, "gpt2-tiny")
    assert not rs.quantities(r.per_arch)["attention output"]
    assert r.corrected_text == "b_O ↦ b_O - c @ W_O"


def test_rule_symbolic_diagonal_group_covers_every_sign():
    assert _sym(VO_DIAG, "gpt2-tiny", "attn-tiny").verdict_holds
    relu_any_sign = {**RELU, "elements": {"s": "diagonal(d_ff)"}}
    r = _sym(relu_any_sign, "gpt2-tiny-relu")  # ReLU needs s > 0
    assert not r.verdict_holds and r.condition.startswith("holds only for s ∈ positive-diagonal(d_ff)")
    assert r.nearest is not None and r.nearest.group == "positive-diagonal(d_ff)"


def test_rule_symbolic_not_applicable_without_a_class():
    with pytest.raises(NotApplicable):
        _sym({**VO_DIAG}, "llama-tiny-gqa")  # head scope on a shared W_V


# ----------------------------------------------------------------------------- precision
def test_qk_gl_rule_precision_residuals_shrink_with_dps():
    r = rp.check(parse_rule(QK), "gpt2-tiny")
    assert r.verdict == "HOLDS" and r.shrinks
    for x in r.residuals:
        assert x.residual <= x.bound and x.residual < 10.0 ** (5 - x.dps)


def test_qk_same_action_rule_precision_certified_counterexample():
    r = rp.check(parse_rule(SAME), "attn-tiny", corrected=parse_rule(QK))
    assert r.verdict == "FAILS" and all(x.residual > 1e-3 for x in r.residuals)
    c = r.certificate
    assert c["excludes_zero"] and c["lower_magnitude"] > 1e6 * c["width"]  # certified away from 0
    assert c["control_contains_zero"] and c["control_max_abs"] < 1e-20


def test_ln_noaffine_rotation_rule_precision_holds_and_ln_affine_fails():
    paper = parse_rule(PAPER)
    assert rp.check(paper, "gpt2-tiny-noaffine").verdict == "HOLDS"
    bad = rp.check(paper, "gpt2-tiny")
    assert bad.verdict == "FAILS" and bad.certificate["excludes_zero"]


# ----------------------------------------------------------------------------- nullity
@pytest.fixture(scope="module")
def reports():
    c = configs()
    return {name: analyze(c[name], seed=0) for name in ("attn", "gpt2", "gpt2-noaffine")}


def test_qk_gl_rule_generators_flat_and_inside_the_theory(reports):
    r = rn.check(parse_rule(QK), reports["attn"])
    assert r.flat and r.rank == 8 and r.new_directions == 0 and "qk-gl" in r.contained_in
    assert r.max_residual_rel <= r.tolerance_rel


def test_qk_same_action_rule_generators_not_flat(reports):
    r = rn.check(parse_rule(SAME), reports["attn"])
    assert not r.flat and r.max_residual_rel > 1e10 * r.tolerance_rel


def test_ln_noaffine_rotation_rule_generators(reports):
    paper = parse_rule({**PAPER, "maps": {k: v for k, v in PAPER["maps"].items() if k not in ("W_gate", "W_router")}})
    ok = rn.check(paper, reports["gpt2-noaffine"])
    assert ok.flat and ok.rank == 10 and ok.new_directions == 0  # (d−1)(d−2)/2 at d = 6
    bad = rn.check(paper, reports["gpt2"])
    assert not bad.flat and bad.max_residual_rel > 1e10 * bad.tolerance_rel


def test_rule_nullity_new_symmetry_lowers_the_unexplained_count(reports):
    """With a theory that lacks vo-gl, the vo-gl rule's generators are new: they explain exactly the
    directions the theory left unexplained."""
    rep = reports["attn"]
    fams = [f for f in rep.families if f.name != "vo-gl"]
    explained = span_rank([f.vectors for f in fams if f.flat]).rank
    lacking = dataclasses.replace(rep, families=fams, explained=explained, unexplained=rep.measured_nullity - explained)
    vo = parse_rule(
        {"scope": "kv-group", "elements": {"N": "GL(d_v)"}, "maps": {"W_V": "W_V @ N", "W_O": "inv(N) @ W_O"}}
    )
    r = rn.check(vo, lacking)
    assert lacking.unexplained == 8 and r.flat and r.new_directions == 8 and r.unexplained_after == 0
    assert rn.check(vo, rep).new_directions == 0


def test_rule_nullity_finite_group_has_no_generators(reports):
    perm = parse_rule(
        {
            "scope": "layer",
            "elements": {"P": "permutation(d_ff)"},
            "maps": {"W_in": "W_in @ P", "b_in": "b_in @ P", "W_out": "transpose(P) @ W_out"},
        }
    )
    with pytest.raises(NotApplicable, match="finite"):
        rn.check(perm, reports["gpt2"])
