"""The nearest true statement of a failed symmetry claim, from a claim file
(claims/examples/nearest_statements.toml): the subgroup the architecture defines on which the
rule holds — or the correction that makes it hold — in the rule language, confirmed by every
checker of the claim; and soundness at every size: a statement true at a special size only (one
rotary plane) is reported as size-dependent, never as general."""

from __future__ import annotations

import json

import pytest

from gauge_audit.audit.evidence import CORRECTED, FAILS
from gauge_audit.audit.nullity_checks import configs, generic_config
from gauge_audit.claims import CATALOG_DIR
from gauge_audit.claims.rule import parse_rule
from gauge_audit.cli import main
from gauge_audit.models import config_of
from gauge_audit.rules.budget import unlimited
from gauge_audit.rules.engine import Shape
from gauge_audit.rules.symbolic import arch_config
from gauge_audit.rules.symbolic.model import SymModel
from gauge_audit.rules.symbolic.nearest import candidates, dimension, nearest

NEAREST = CATALOG_DIR / "examples" / "nearest_statements.toml"
READER_FOLD = "inv(diag(norm1.w)) @ transpose(R) @ diag(norm1.w) @ W_Q"


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    out = tmp_path_factory.mktemp("nearest") / "r"
    assert main(["audit", str(NEAREST), "--out", str(out), "--quiet"]) in (0, 1)
    return out


@pytest.fixture(scope="module")
def report(audited):
    data = json.loads((audited / "report.json").read_text(encoding="utf-8"))
    return {c["id"]: c for c in data["claims"]}


def test_rope_same_rotation_fails_and_its_nearest_statement_is_a_rotation_per_plane(report):
    c = report["rope-qk-same-rotation"]
    assert c["verdict"] == FAILS  # at d_k = 2 (one plane) the symbolic checker used to say HOLDS
    assert c["evidence"]["symbolic"]["outcome"] == FAILS
    n = c["nearest"]
    assert n["group"] == "rotary-SO(d_k)" and not n["corrected_maps"]
    assert n["rule"]["elements"] == {"R": "rotary-SO(d_k)"}
    assert set(n["confirmed_by"]) == {"symbolic", "precision", "torch", "nullity"} and not n["contradicted_by"]
    assert [s["d_k"] for s in n["checked_at_sizes"]] == [4, 6]  # two and three rotary planes
    assert n["dimension_at_sizes"] == [2, 3]  # one rotation angle per plane
    _wide_margin(c["evidence"]["torch"]["details"])


def _wide_margin(details: dict) -> None:
    """The stated rule fails by a wide margin on every model — at least 10¹⁰ times its derived
    statistical tolerance κ·λ·√(L·K)·ε — and the nearest statement stays within that tolerance."""
    for row in details["results"]:
        assert row["residual_eps"] > 1e10 * row["tolerance_statistical_eps"], row
    for row in details["nearest"]:
        assert row["residual_eps"] <= row["tolerance_statistical_eps"], row


def test_rope_gl_condition_is_the_rotary_commutant_not_so(report):
    c = report["rope-qk-gl"]
    assert c["verdict"] == FAILS
    assert "SO(d_k)" not in c["evidence"]["symbolic"]["summary"].split("nearest")[0]
    assert "holds only for M ∈ rotary-GL(d_k)" in c["evidence"]["symbolic"]["summary"]
    assert c["nearest"]["group"] == "rotary-GL(d_k)"
    _wide_margin(c["evidence"]["torch"]["details"])
    assert "nullity" in c["nearest"]["confirmed_by"] and "torch" in c["nearest"]["confirmed_by"]
    # two KV groups, each 2 scales + 2 angles at d_k = 4
    assert "span 8 flat direction(s)" in c["evidence"]["nullity"]["summary"]


def test_gpt2_any_rotation_nearest_is_o1_with_the_layernorm_weight_folded_through_the_readers(report):
    c = report["gpt2-stream-any-rotation"]
    assert c["verdict"] == FAILS
    n = c["nearest"]
    assert n["group"] == "O1(d_model)"
    assert n["corrected_maps"]["W_Q"] == READER_FOLD
    assert n["corrected_maps"]["norm1.b"] == "norm1.b @ inv(diag(norm1.w)) @ R @ diag(norm1.w)"
    assert set(n["confirmed_by"]) == {"symbolic", "precision", "torch", "nullity"}
    _wide_margin(c["evidence"]["torch"]["details"])


def test_gpt2_permutation_is_corrected_by_permuting_the_layernorm_parameters(report):
    c = report["gpt2-stream-permutation"]
    assert c["verdict"] == CORRECTED
    for norm in ("norm1", "norm2", "norm_f"):
        assert f"{norm}.w ↦ {norm}.w @ P" in c["corrected_rule"]
        assert f"{norm}.b ↦ {norm}.b @ P" in c["corrected_rule"]


def test_report_files_show_the_nearest_statement(audited):
    md = (audited / "report.md").read_text(encoding="utf-8")
    html = (audited / "report.html").read_text(encoding="utf-8")
    assert "Nearest true statement: M ∈ rotary-GL(d_k) instead of GL(d_k)" in md
    assert "per kv-group, M ∈ rotary-GL(d_k)" in md
    assert "Nearest true statement:" in html and "rotary-GL" in html


# ----------------------------------------------------------------------------- sizes
def test_symbolic_sizes_are_generic_for_rope_gqa_and_partial_rotary():
    llama = arch_config(config_of("llama-tiny"))
    assert llama.d_head == 4 and len(Shape.of(llama).planes) == 2
    big = arch_config(config_of("llama-tiny"), size=1)
    assert big.d_head == 6 and len(Shape.of(big).planes) == 3 and big.d_model == llama.d_model + 1
    gqa = arch_config(config_of("llama-tiny-gqa"))
    assert (gqa.n_heads, gqa.n_kv_heads) == (4, 2)
    partial = arch_config(config_of("llama-tiny").with_(d_head=8, rotary_dim=4))
    assert (partial.rotary_dim, partial.d_head) == (4, 6)  # two planes and a pass-through block of two
    pl = Shape.of(partial).planes
    assert dimension("rotary-GL", 6, pl) == 2 * 2 + 2 * 2 and dimension("rotary-SO", 6, pl) == 2 + 1


def test_a_statement_true_at_one_rotary_plane_only_is_size_dependent():
    """At d_k = 2 (one plane) SO(2) commutes with RoPE, so W_Q·R, W_K·R holds for R ∈ SO(2) there; the
    search re-checks at the generic size, records it as size-dependent and goes on to the rotations
    that commute with RoPE at every size (rotary-O: one rotation per plane), which hold at both."""
    rule = parse_rule({"scope": "kv-group", "elements": {"R": "O(d_k)"}, "maps": {"W_Q": "W_Q @ R", "W_K": "W_K @ R"}})
    special = config_of("llama-tiny").with_(d_head=2, d_model=3, n_layers=1, n_heads=1, n_kv_heads=1, d_ff=2)
    assert candidates(rule.elements[0], 2, Shape.of(special).planes)[0] == "SO"
    second = [SymModel.of(config_of("llama-tiny"), rule)]
    found = nearest(rule, [_at(special)], second, unlimited(), allow_correction=False)
    assert any(s.startswith("R ∈ SO(d_k)") and "size-dependent" in s for s in found.size_dependent)
    assert found.found is not None and found.found.group == "rotary-O(d_k)"


def _at(cfg):
    """A symbolic block at exactly this (special) size, not raised to the generic one."""
    from gauge_audit.rules.symbolic.model import _symbolic_params

    return SymModel(cfg, _symbolic_params(cfg))


def test_rule_nullity_configuration_is_generic():
    llama = generic_config(configs()["llama"])
    assert llama.d_head == 4 and (llama.n_heads, llama.n_kv_heads) == (4, 2)
    assert generic_config(configs()["gpt2"]) == configs()["gpt2"]
