"""Transformation rules as data: the [claim.rule] schema and its parser, the engine on the project's
layout, and the torch checker against the built-in actions (same verdicts, same tolerances)."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from gauge_audit.claims import CATALOG_DIR, load_file, load_text
from gauge_audit.claims.matexpr import Symbol, parse_expression
from gauge_audit.claims.rule import parse_rule
from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models import NAMED, build_config, config_of
from gauge_audit.numeric import FAILS, HOLDS, check
from gauge_audit.rules import ProjectView, Shape, apply, check_rule, draw, models_for, transform
from gauge_audit.rules.engine import NotApplicable, applicability
from gauge_audit.runtime import eps
from rule_tables import PAPER, QK, SAME, VO

EXAMPLE_RULE = """
[document]
title = "T"
authors = ["A"]
reference = "R"

[[claim]]
id = "paper-vo-diagonal"
location = "Sec. 3, eq. (7)"
statement = "Scaling each value channel by s_i and the matching output row by 1/s_i is a symmetry."
kind = "symmetry"
checkers = ["symbolic", "precision", "torch", "nullity"]
expected = "holds"
params = { family = "gpt2" }

[claim.rule]
scope = "head"
elements = { s = "diagonal(d_v)" }
[claim.rule.maps]
W_V = "W_V @ diag(s)"
b_V = "b_V @ diag(s)"
W_O = "inv(diag(s)) @ W_O"
"""


# ----------------------------------------------------------------------------- schema
def test_rule_schema_loads_the_documented_example():
    _, (claim,) = load_text(EXAMPLE_RULE, "paper.toml")
    r = claim.rule
    assert r.scope == "head" and [(e.symbol, e.group, e.dim) for e in r.elements] == [("s", "diagonal", "d_v")]
    assert [m.param for m in r.maps] == ["W_V", "b_V", "W_O"]
    assert r.map_of("W_O").text == "inv(diag(s)) @ W_O" and r.map_of("W_O").node.shape == ("d_v", "d_model")
    assert claim.params["family"] == "gpt2" and claim.action is None


def test_rule_schema_dotted_and_quoted_norm_keys_are_the_same_parameter():
    for spelling in ('"norm1.w" = "norm1.w * s"', 'norm1.w = "norm1.w * s"', 'norm1 = { w = "norm1.w * s" }'):
        text = (
            EXAMPLE_RULE.replace('W_V = "W_V @ diag(s)"', 'W_V = "W_V @ diag(s)"\n' + spelling)
            .replace(
                'elements = { s = "diagonal(d_v)" }',
                'elements = { s = "diagonal(d_v)", t = "positive-diagonal(d_model)" }',
            )
            .replace("norm1.w * s", "norm1.w * t")
        )
        _, (claim,) = load_text(text, "p.toml")
        assert claim.rule.map_of("norm1.w").text == "norm1.w * t", spelling


def _problems(text: str) -> list[str]:
    with pytest.raises(GaugeAuditError) as exc:
        load_text(textwrap.dedent(text), "bad.toml")
    return exc.value.lines


BAD = (
    EXAMPLE_RULE.split("[claim.rule]")[0]
    + """[claim.rule]
scope = "heads"
elements = { s = "translation(d_v)", M = "GL(d_q)", N = "Foo(3)", W_Q = "GL(2)" }
[claim.rule.maps]
W_V = "W_V @ diag(s) @ X"
b_V = "b_V @ inv(diag(s))"
W_O = "W_O @ W_O"
W_Z = "1"
b_U = "b_U"
W_K = "W_K @ foo(M)"
W_in = "W_in @ (("
b_K = 3
"""
)


def test_rule_schema_reports_every_problem_with_its_line():
    lines = _problems(BAD)
    want = [
        (17, "rule.scope"),
        (18, "rule.elements.M: unknown dimension"),
        (18, "rule.elements.N: unknown group"),
        (18, "rule.elements.W_Q: 'W_Q' is a parameter"),
        (20, "unknown name 'X'"),
        (21, "inv(diag(s)) is not guaranteed to exist: the vector's entries may vanish: s ∈ translation(d_v)"),
        (22, "'@' needs inner dimensions to agree, got d_v×d_model @ d_v×d_model"),
        (23, "unknown parameter 'W_Z'"),
        (24, "no reference model has b_U"),
        (25, "unknown function 'foo'"),
        (26, "rule.maps.W_in: expression 'W_in @ ((': unexpected end"),
        (27, "rule.maps.b_K: expected an expression string"),
    ]
    assert len(lines) == len(want), lines
    for line, (no, text) in zip(lines, want):
        assert line.startswith(f"bad.toml:{no}: field rule") and text in line and "\n" not in line, (line, no, text)


@pytest.mark.parametrize(
    "maps,message",
    [
        ({"W_Q": "W_Q @ M", "W_K": "W_K @ transpose(M) @ W_K"}, "inner dimensions"),
        ({"W_Q": "W_Q @ M + 1"}, "'+' needs equal shapes"),
        ({"W_Q": "W_Q * M"}, "element-wise product of equal shapes"),
        ({"W_Q": "W_Q @ inv(W_Q)"}, "inv() needs a square matrix"),
        ({"W_Q": "W_Q @ inv(M + M)"}, "a sum or difference need not be invertible"),
        ({"W_Q": "W_Q @ inv(outer(ones(d_k), ones(d_k)))"}, "an outer product has rank one"),
        ({"W_Q": "W_Q @ M @"}, "unexpected end"),
        ({"W_Q": "W_Q @ diag(M)"}, "diag() takes a vector"),
        ({"W_Q": "W_Q @ eye(d_k, d_k)"}, "expected ')'"),
        ({"W_Q": "W_Q @ eye(q)"}, "expected a dimension"),
        ({"W_Q": "__import__('os')"}, "unexpected character"),
        ({"W_Q": "W_Q @ M", "W_K": "W_K"}, None),
    ],
)
def test_rule_expression_errors_are_one_line(maps, message):
    table = {"scope": "head", "elements": {"M": "GL(d_k)"}, "maps": maps}
    if message is None:
        assert parse_rule(table).map_of("W_K").text == "W_K"
        return
    with pytest.raises(GaugeAuditError) as exc:
        parse_rule(table)
    assert len(exc.value.lines) == 1 and message in exc.value.lines[0], exc.value.lines


def test_rule_schema_unused_element_and_action_conflict(tmp_path, capsys):
    text = EXAMPLE_RULE.replace(
        'elements = { s = "diagonal(d_v)" }', 'elements = { s = "diagonal(d_v)", u = "GL(d_k)" }'
    ).replace('expected = "holds"', 'expected = "holds"\naction = "vo-gl"')
    lines = _problems(text)
    assert any("field action: a claim with a [claim.rule] names no action" in ln for ln in lines)
    assert any(re.match(r"bad\.toml:19: field rule\.elements\.u: declared but used in no map", ln) for ln in lines)
    bad = tmp_path / "bad.toml"
    bad.write_text(text, encoding="utf-8")
    assert main(["audit", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(ln.startswith(f"gauge-audit: error: {bad}:") for ln in err)


def test_rule_expression_parser_renders_and_tracks_shapes():
    syms = {
        "W": Symbol(("d_model", "d_k"), "generic", "param"),
        "M": Symbol(("d_k", "d_k"), "group", "element"),
        "c": Symbol((1, "d_k"), "none", "element"),
    }
    text = "W @ inv(transpose(M)) + -(outer(ones(d_model), ones(d_model)) @ W) * 2 - outer(ones(d_model), c)"
    n = parse_expression(text, syms)
    assert n.shape == ("d_model", "d_k") and n.inv == "none" and n.text() == text
    assert parse_expression("W - (W - W)", syms).text() == "W - (W - W)"
    sq = {"X": Symbol(("d_model", "d_model"), "generic", "param"), "c": Symbol((1, "d_model"), "none", "element")}
    assert parse_expression("X + -(transpose(c) @ c)", sq).text() == "X - transpose(c) @ c"


# ----------------------------------------------------------------------------- engine / applicability
def _reason(rule_table, model):
    from gauge_audit.models import FAMILIES

    cfg = config_of(model) if isinstance(model, str) else model
    return applicability(
        parse_rule(rule_table), Shape.of(cfg), ProjectView(cfg, FAMILIES[cfg.family].param_shapes(cfg)).has
    )


def test_rule_applicability_absent_tensors_and_shared_kv_heads():
    head_vo = {**VO, "scope": "head"}
    assert _reason(head_vo, "gpt2-tiny") is None
    assert "shared by 2 elements" in _reason(head_vo, "llama-tiny-gqa")  # one W_V, two query heads
    assert _reason(VO, "llama-tiny-gqa") is None  # kv-group scope ties them
    kbs = {"scope": "kv-group", "elements": {"c": "translation(d_k)"}, "maps": {"b_K": "b_K + c"}}
    assert "none of the rule's parameters" in _reason(kbs, "llama-tiny")
    kbs["maps"]["W_K"] = "W_K"
    assert "has no b_K" in _reason(kbs, "llama-tiny")  # the shift would create one
    assert _reason(QK, "llama-tiny") is None  # absent biases stay zero
    assert "no token embedding" in _reason(PAPER, "attn-tiny")
    assert "no unembedding" in _reason(PAPER, "bert-tiny")
    assert _reason(PAPER, "moe-tiny") is None and _reason(PAPER, "gpt2-tiny-tied") is None
    fold = {
        "scope": "layer",
        "elements": {"s": "positive-diagonal(d_model)"},
        "maps": {"norm1.w": "norm1.w * s", "W_Q": "inv(diag(s)) @ W_Q"},
    }
    assert "γ = 1" in _reason(fold, "llama-tiny-noweight")
    gl4 = {"scope": "head", "elements": {"M": "GL(4)"}, "maps": {"W_Q": "W_Q @ M"}}
    assert _reason(gl4, "gpt2-tiny") is None  # d_k = 4 there
    assert "shape mismatch in '@': 16×2 and 4×4" in _reason(gl4, NAMED["gpt2-tiny"].with_(d_head=2))


def test_rule_engine_matches_the_builtin_qk_gl_action_exactly(model):
    """Same element, same parameters: the rule path and actions.qk_gl give identical tensors."""
    from gauge_audit.actions import get_action
    from gauge_audit.actions.base import Element

    m = model("llama-tiny-gqa")
    rule = parse_rule({**QK, "elements": {"M": "GL(d_k)"}})
    d = draw(rule, Shape.of(m.cfg), 1)
    M = torch.stack(
        [
            torch.stack([d.elements[c]["M"] for c in sorted(d.elements, key=lambda c: (c.layer, c.kv)) if c.layer == l])
            for l in range(m.cfg.n_layers)
        ]
    )
    cfg = m.cfg.with_(pos="none")  # the commutant check aside, the maps are the same
    ours, _ = transform(cfg, m.params, rule, d)
    theirs = get_action("qk-gl").apply(cfg, m.params, Element({"M": M}, 1.0))
    # M·M⁻¹ evaluated two ways (batched vs per head, inv(Mᵀ) vs inv(M)ᵀ): equal to κ·(d_model + d_k)·ε
    tol = d.kappa * (cfg.d_model + cfg.d_head) * eps(torch.float64)
    for k in theirs:
        diff = float((ours[k] - theirs[k]).abs().max() / theirs[k].abs().max())
        assert diff <= tol, (k, diff, tol)
    assert any(not torch.equal(ours[k], m.params[k]) for k in theirs)


def test_signed_permutation_recognised_in_every_layout():
    """A signed permutation is recognised as such — contiguous, as a transpose (read through its
    contiguous original), with its columns shuffled — with the column and sign of each row; a
    matrix with a repeated column, a scaled one or a dense one is not one."""
    from gauge_audit.rules.algebra import _signed_permutation

    g = torch.Generator().manual_seed(11)
    for n in (2, 7, 300):
        signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
        P = torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=g)] * signs[:, None]
        for a in (P, P.T, P.T.contiguous(), P[:, torch.randperm(n, generator=g)], P.T[torch.randperm(n, generator=g)]):
            cols, vals = _signed_permutation(a)
            rebuilt = torch.zeros(n, n, dtype=torch.float64)
            rebuilt[torch.arange(n), cols] = vals
            assert torch.equal(rebuilt, a)
        repeated = P.clone()
        repeated[1] = repeated[0]  # n non-zeros, but one column twice and one empty
        for a in (2 * P, 2 * P.T, repeated, repeated.T, torch.randn(n, n, dtype=torch.float64, generator=g)):
            assert _signed_permutation(a) is None


def test_rule_permutation_factor_is_gathered_exactly():
    """A wide signed permutation on either side of a product is a gather, bit-for-bit the dense
    product (each entry is one entry times ±1); a near-permutation is multiplied densely."""
    from gauge_audit.rules.algebra import PERMUTATION_MIN, TorchOps

    ops, g = TorchOps(), torch.Generator().manual_seed(4)
    n = PERMUTATION_MIN + 3
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    P = torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=g)] * signs[None, :]
    x, y = torch.randn(5, n, dtype=torch.float64, generator=g), torch.randn(n, 6, dtype=torch.float64, generator=g)
    for got, want in ((ops.matmul(x, P), x @ P), (ops.matmul(P, y), P @ y), (ops.matmul(P.T, y), P.T @ y)):
        assert torch.equal(got, want)
    near = P.clone()
    near[0, :] += 1e-3  # one row no longer a unit vector: not a permutation, the dense product
    assert torch.equal(ops.matmul(x, near), x @ near)
    # the dense product differs from the gathered one by x[:, 0]·1e-3 in every column: far above rounding
    gap = float((ops.matmul(x, near) - ops.matmul(x, P)).abs().max())
    assert gap >= 0.5e-3 * float(x[:, 0].abs().max())
    # differentiated at the identity element: the tangent of the factor is kept (the nullity
    # checker's generators are such derivatives), forward mode and reverse mode
    X = torch.randn(n, n, dtype=torch.float64, generator=g)
    eye = torch.eye(n, dtype=torch.float64)
    t0, one = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    _, dv = torch.func.jvp(
        lambda t: TorchOps(check_singular=False, tangents=True).matmul(x, eye + t * X), (t0,), (one,)
    )
    eps64 = torch.finfo(torch.float64).eps
    assert float((dv - x @ X).abs().max()) <= n * eps64 * float((x.abs() @ X.abs()).max())  # a product of length n
    e = eye.clone().requires_grad_()
    ops.matmul(x, e).sum().backward()
    # ∂/∂e_ij Σ (x·e) = Σ_r x_ri: a sum of x.shape[0] terms; a gather would give 0 off the diagonal
    assert float((e.grad - x.sum(0)[:, None]).abs().max()) <= x.shape[0] * eps64 * float(x.abs().sum(0).max())


def test_rule_tied_unembedding_consistency():
    m = build_config(NAMED["gpt2-tiny-tied"], 0, "cpu")
    paper = parse_rule(PAPER)
    new, _ = transform(m.cfg, m.params, paper, draw(paper, Shape.of(m.cfg), 1))  # (W_E·R)ᵀ = Rᵀ·W_Eᵀ: consistent
    assert "unembed.W_U" not in new
    wrong = parse_rule({**PAPER, "maps": {**PAPER["maps"], "W_U": "R @ W_U"}})
    with pytest.raises(NotApplicable, match="tied"):
        transform(m.cfg, m.params, wrong, draw(wrong, Shape.of(m.cfg), 1))


def test_rule_increments_sum_over_heads(model):
    """b_O − c @ W_O at head scope folds every head's value shift: the value-bias-fold action."""
    m = model("gpt2-tiny")
    rule = parse_rule(
        {"scope": "head", "elements": {"c": "translation(d_v)"}, "maps": {"b_V": "b_V + c", "b_O": "b_O - c @ W_O"}}
    )
    d = draw(rule, Shape.of(m.cfg), 1)
    new, _ = transform(m.cfg, m.params, rule, d)
    c0 = torch.cat([d.elements[u]["c"] for u in sorted(d.elements, key=lambda u: u.head) if u.layer == 0])
    want = m.params["blocks.0.attn.b_O"] - torch.einsum("he,hed->d", c0, m.params["blocks.0.attn.W_O"])
    assert torch.allclose(new["blocks.0.attn.b_O"], want, rtol=0, atol=64 * eps(torch.float64))


# ----------------------------------------------------------------------------- torch checker vs built-in actions
PAIRS = [
    ("qk-gl", QK, ("gpt2-tiny", "bert-tiny", "attn-tiny-gqa", "minilm")),
    ("vo-gl", VO, ("gpt2-tiny", "llama-tiny-gqa", "moe-tiny", "qwen-tiny", "minilm")),
    ("qk-same-action", SAME, ("gpt2-tiny", "llama-tiny", "attn-tiny")),
    (
        "stream-rotation-paper",
        PAPER,
        ("gpt2-tiny", "gpt2-tiny-noaffine", "llama-tiny", "llama-tiny-noweight", "gpt2-tiny-tied", "moe-tiny"),
    ),
]


@pytest.mark.parametrize("action,table,models", PAIRS, ids=[p[0] for p in PAIRS])
def test_rule_torch_verdicts_match_builtin_actions(model, action, table, models):
    rule = parse_rule(table)
    for name in models:
        m = model(name)
        ours, theirs = check_rule(m, rule, seed=0), check(m, action, seed=0)
        assert ours.holds == theirs.holds, (name, ours.verdict, theirs.verdict)
        if ours.holds:  # both within the derived tolerance, printed in ε
            assert ours.residual_eps <= ours.tolerance_statistical_eps and ours.kappa >= 1
        else:  # a false rule misses by a large margin
            assert ours.max_rel_error > 1e6 * ours.tolerance, (name, ours.max_rel_error)


def test_rule_torch_float32_tolerance_from_storage_dtype(model):
    from gauge_audit.numeric import tolerance

    m = model("gpt2-tiny")
    r = check_rule(m, parse_rule(VO), seed=0, dtype="float32")
    want, _ = tolerance(m, r.kappa, torch.float32, m.sample_inputs(0)["tokens"].shape[1])
    assert r.verdict == HOLDS and r.dtype == "float32" and r.tolerance == pytest.approx(want, rel=1e-12)
    bad = check_rule(m, parse_rule(SAME), seed=0, dtype="float32")
    assert bad.verdict == FAILS and bad.max_rel_error > 1e3 * bad.tolerance


def test_rule_models_for_reports_reasons():
    ok, skipped = models_for(parse_rule(QK), ["gpt2-tiny", "llama-tiny", "attn-tiny"])
    assert ok == ["gpt2-tiny", "llama-tiny", "attn-tiny"] and skipped == {}
    ok, skipped = models_for(parse_rule(PAPER), ["gpt2-tiny", "attn-tiny", "bert-tiny"])
    assert ok == ["gpt2-tiny"] and set(skipped) == {"attn-tiny", "bert-tiny"}


def test_rule_apply_never_mutates_inputs(model):
    m = model("llama-tiny")
    before = {k: v.clone() for k, v in m.params.items()}
    rule = parse_rule(PAPER)
    view = ProjectView(m.cfg, m.params)
    view.updated(apply(rule, view, draw(rule, Shape.of(m.cfg), 3).elements))
    assert all(torch.equal(before[k], m.params[k]) for k in before)


def test_rule_example_files_load():
    for name in ("example_paper.toml", "catalog_as_rules.toml"):
        _, claims = load_file(CATALOG_DIR / "examples" / name)
        assert claims
    _, claims = load_file(CATALOG_DIR / "examples" / "catalog_as_rules.toml")
    assert len([c for c in claims if c.rule]) >= 8
