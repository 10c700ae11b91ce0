"""The rule path is general: the catalog restated as rules (claims/examples/catalog_as_rules.toml)
reaches the built-in path's verdicts, claim by claim and model by model; the example paper's rules
in no catalog get their verdicts; a rule claim's Lean evidence says why it is NOT-RUN."""

from __future__ import annotations

import json

import pytest

from gauge_audit.audit.evidence import CORRECTED, FAILS, HOLDS
from gauge_audit.audit.run import audit
from gauge_audit.claims import CATALOG_DIR, load_file
from gauge_audit.cli import main
from gauge_audit.numeric import check
from gauge_audit.symbolic import DERIVATIONS

RULES = CATALOG_DIR / "examples" / "catalog_as_rules.toml"
EXAMPLE = CATALOG_DIR / "examples" / "example_paper.toml"


@pytest.fixture(scope="module")
def rules_report(audit_context):
    """The catalog restated as rules, audited in the catalog audit's context (seed 0): the models
    and nullity measurements both audits use are built once."""
    _, claims = load_file(RULES)
    report = audit(claims, audit_context)
    return {r.claim.id: r for r in report.results}


def _same_as_catalog(rules_report, catalog_report, claim_id: str) -> str:
    built_in = catalog_report[0].verdicts()[claim_id]
    got = rules_report[f"rule-{claim_id}"].verdict.verdict
    assert got == built_in, (claim_id, got, built_in)
    return got


def test_qk_gl_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "qk-gl") == HOLDS


def test_vo_gl_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "vo-gl") == HOLDS


def test_qk_same_action_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "qk-same-action") == FAILS
    r = rules_report["rule-qk-same-action"]
    sym = next(e for e in r.evidence if e.checker == "symbolic")
    assert sym.outcome == FAILS and sym.corrected_rule == "W_K ↦ W_K @ inv(transpose(M))"  # a derivation: reported


def test_qk_orthogonal_only_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "qk-orthogonal-only") == FAILS


def test_qk_orthogonal_only_orthogonal_case_matches_builtin_evidence(rules_report, model):
    """The claim's orthogonal case holds: the built-in qk-same-action derivation's condition is
    M·Mᵀ = I, and the built-in qk-gl action with an orthogonal element (M⁻ᵀ = M) holds."""
    import torch

    from gauge_audit.actions.base import Element, random_orthogonal

    assert rules_report["rule-qk-orthogonal-case"].verdict.verdict == HOLDS
    assert "M·Mᵀ = I" in DERIVATIONS["qk-same-action"]().derived
    m = model("attn-tiny")
    g = torch.Generator().manual_seed(3)
    M = torch.stack(
        [
            torch.stack([random_orthogonal(m.cfg.d_head, g) for _ in range(m.cfg.n_kv_heads)])
            for _ in range(m.cfg.n_layers)
        ]
    )
    assert check(m, "qk-gl", element=Element({"M": M}, 1.0)).holds


def test_value_g3_eq_g0_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "value-g3-eq-g0") == FAILS
    sym = next(e for e in rules_report["rule-value-g3-eq-g0"].evidence if e.checker == "symbolic")
    assert sym.corrected_rule == "W_V ↦ transpose(R) @ W_V" and "R² = I" in sym.summary  # g(3) = g(0) iff g(0)² = I


def test_ln_affine_rotation_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "ln-affine-rotation") == CORRECTED
    ev = {e.checker: e for e in rules_report["rule-ln-affine-rotation"].evidence}
    assert all(ev[c].outcome == CORRECTED for c in ("symbolic", "precision", "torch", "nullity"))
    assert ev["lean"].outcome == "NOT-RUN" and "no Lean theorem" in ev["lean"].summary


def test_ln_noaffine_rotation_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "ln-noaffine-rotation") == HOLDS


def test_relu_forces_identity_rule_path_same_verdict(rules_report, catalog_report):
    assert _same_as_catalog(rules_report, catalog_report, "relu-forces-identity") == FAILS


@pytest.mark.parametrize(
    "rule_id,action",
    [
        ("rule-gelu-scaling", "gelu-scaling"),
        ("rule-key-bias-shift", "key-bias-shift"),
        ("rule-ffn-perm", "ffn-perm"),
        ("rule-qk-gl", "qk-gl"),
        ("rule-vo-gl", "vo-gl"),
        ("rule-ln-affine-rotation", "stream-rotation-paper"),
        ("rule-ln-noaffine-rotation", "stream-rotation-paper"),
        ("rule-relu-forces-identity", "relu-scaling"),
    ],
)
def test_rule_torch_rows_match_builtin_actions_per_model(rules_report, catalog_report, audit_context, rule_id, action):
    """Each model's row of the rule's torch check agrees with the built-in action's check on that
    model — the one the catalog audit measured in the same context (seed 0, the same inputs; the
    context measures a pair the catalog did not name as a fresh check would).  The catalog audit
    is asked for first, so that its report holds only checks it measured itself."""
    rows = {
        r["model"]: r
        for r in rules_report[rule_id]
        .evidence[[e.checker for e in rules_report[rule_id].evidence].index("torch")]
        .details["results"]
    }
    assert rows
    for name, row in rows.items():
        if name == "minilm":
            continue
        built_in = audit_context.check(name, action)
        assert (row["verdict"] != "FAILS") == built_in.holds, (rule_id, name, row["verdict"], built_in.verdict)
        if built_in.holds:  # same tolerance formula, same order of residual
            assert row["residual_eps"] <= row["tolerance_statistical_eps"]


def test_rule_claims_example_paper_verdicts(tmp_path, capsys):
    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "r" / "report.json").read_text(encoding="utf-8"))
    got = {c["id"]: c["verdict"] for c in data["claims"]}
    assert got == {
        "example-relu-rescaling": HOLDS,
        "example-gelu-rescaling": FAILS,
        "example-stream-rotation": CORRECTED,
        "example-attention-dimension": FAILS,
        "example-vo-diagonal": HOLDS,
        "example-rmsnorm-fold": HOLDS,
        "example-swiglu-gate-scaling": FAILS,
        "example-value-shift": CORRECTED,
    }
    claims = {c["id"]: c for c in data["claims"]}
    assert claims["example-value-shift"]["corrected_rule"] == "b_O ↦ b_O - c @ W_O"
    assert claims["example-swiglu-gate-scaling"]["counterexample"]
    dim = claims["example-attention-dimension"]["evidence"]["nullity"]
    assert "measured symmetry dimension 16" in dim["summary"]  # h(d_k² + d_v²) = 2·(4 + 4), not 2·1 + 8
    assert "example-swiglu-gate-scaling" in out
