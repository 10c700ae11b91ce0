"""Budgets of the rule checkers' searches: false head-scoped rules that used to keep the correction
search busy for many minutes settle within the claim budget with the stated verdict and its
counterexample; a spent budget is said, not hidden; the solver gates polynomial systems by size;
symbolic blocks are big enough that no declared group is trivial; ``audit --max-minutes``."""

from __future__ import annotations

import random
import time

import pytest
import sympy as sp

from gauge_audit.audit import rule_checks as rc
from gauge_audit.audit.checkers import Context
from gauge_audit.audit.evidence import CORRECTED, FAILS, HOLDS, NOT_APPLICABLE, NOT_RUN, UNDECIDED
from gauge_audit.audit.run import audit
from gauge_audit.claims import Claim, Document
from gauge_audit.claims.rule import parse_rule
from gauge_audit.cli import main
from gauge_audit.models import config_of
from gauge_audit.rules import symbolic as rs
from gauge_audit.rules.budget import CLAIM_SECONDS, Budget
from gauge_audit.rules.engine import NotApplicable
from gauge_audit.rules.solve import POLY_LIMITS, solve_sampled, unique_linear

DOC = Document("budget", "budget tests", (), "tests/test_rules_budget.py", "budget.toml")
HANG_MARGIN = 60.0  # CPU seconds; a hang detector, not a speed test: the old search ran 10–20 minutes on these

BQ_SHIFT = {"scope": "head", "elements": {"c": "translation(d_k)"}, "maps": {"b_Q": "b_Q + c"}}
VO_TRANSPOSE = {"scope": "head", "elements": {"N": "GL(d_v)"}, "maps": {"W_V": "W_V @ N", "W_O": "transpose(N) @ W_O"}}
QK_SAME = {"scope": "head", "elements": {"M": "GL(d_k)"}, "maps": {"W_Q": "W_Q @ M", "W_K": "W_K @ M"}}
SO1_NO_BIAS = {"scope": "head", "elements": {"N": "SO1(d_v)"}, "maps": {"W_V": "W_V @ N", "W_O": "transpose(N) @ W_O"}}
PERM_BV = {
    "scope": "head",
    "elements": {"M": "permutation(d_v)"},
    "maps": {"W_V": "W_V @ M", "b_V": "b_V @ transpose(M)", "W_O": "M @ W_O"},
}


def _claim(table, params=None, models=None, checkers=("symbolic", "torch", "precision")) -> Claim:
    return Claim(
        "c",
        DOC,
        "budget",
        "x",
        "a rule",
        "symmetry",
        tuple(checkers),
        params or {},
        models=models,
        rule=parse_rule(table),
        expected="holds",
    )


HANGS = {
    "b_Q + c": (BQ_SHIFT, {}, ("gpt2-tiny", "bert-tiny")),
    "W_V·N, Nᵀ·W_O (llama)": (VO_TRANSPOSE, {"family": "llama"}, None),
    "W_Q·M, W_K·M (gpt2)": (QK_SAME, {"family": "gpt2"}, None),
}


@pytest.mark.parametrize("name", list(HANGS))
def test_false_head_rule_settles_within_the_claim_budget_with_its_counterexample(name):
    """torch first: it asks the derivation for the corrected rule (as with checkers = ["torch", "precision"])."""
    table, params, models = HANGS[name]
    claim = _claim(table, params, models, checkers=("torch", "precision", "symbolic"))
    ctx = Context(seed=0)
    t = time.process_time()
    ev = {n: rc.run(n, claim, ctx) for n in claim.checkers}
    elapsed = time.process_time() - t
    assert elapsed <= CLAIM_SECONDS + HANG_MARGIN, elapsed
    d = rc.derivation(claim, ctx)
    assert not d.verdict_holds and d.counterexample
    for e in ev.values():  # the stated rule is refuted by every checker, with a counterexample
        assert e.outcome in (FAILS, CORRECTED), (name, e)
        assert e.counterexample, (name, e)
    if d.corrected is None:  # said, whether the search ended or its budget did
        assert all("no correction found" in e.summary for e in ev.values()), ev
    else:
        assert all(e.outcome == CORRECTED for e in ev.values()), ev


def test_vo_transpose_rule_gets_the_inverse_as_its_correction():
    claim = _claim(VO_TRANSPOSE, {"family": "llama"})
    ctx = Context(seed=0)
    d = rc.derivation(claim, ctx)
    assert d.corrected_text == "W_O ↦ inv(N) @ W_O"
    assert rc.run("torch", claim, ctx).outcome == CORRECTED


def test_a_spent_budget_keeps_the_verdict_and_says_what_it_cut():
    r = rs.check(parse_rule(BQ_SHIFT), [config_of("gpt2-tiny")], Budget(0.0))
    assert not r.verdict_holds and r.corrected is None
    assert any(c.startswith("no correction found within") for c in r.budget_cut), r.budget_cut
    assert r.counterexample and "attention scores" in r.counterexample  # the generic draw, still concrete
    claim = _claim(BQ_SHIFT, models=("gpt2-tiny",), checkers=("symbolic", "torch"))
    ctx = Context(seed=0)
    ctx.cache[rc.SECONDS_KEY] = 0.0
    ev = {n: rc.run(n, claim, ctx) for n in claim.checkers}
    assert ev["symbolic"].outcome == FAILS and "no correction found within" in ev["symbolic"].summary
    assert ev["torch"].outcome == FAILS and "no correction found within" in ev["torch"].summary


def test_the_derivation_is_deterministic_within_its_size_limits():
    a = rs.check(parse_rule(VO_TRANSPOSE), [config_of("llama-tiny")]).to_json()
    b = rs.check(parse_rule(VO_TRANSPOSE), [config_of("llama-tiny")]).to_json()
    assert a == b and not a["budget_cut"]


# ----------------------------------------------------------------------------- the solver
def test_linear_unknowns_are_solved_exactly():
    b = sp.symbols("b0:2")
    x, y = sp.symbols("x y", real=True)
    res = [(b[0] - 3) * x + (b[1] + sp.Rational(1, 2)) * y, (b[0] - 3) * y * x]
    sol, _, why = solve_sampled(res, list(b), set(), random.Random(0), Budget(None))
    assert sol == {b[0]: 3, b[1]: sp.Rational(-1, 2)}, why
    assert unique_linear([b[0] + b[1] - 1, b[0] - b[1]], list(b)) == {b[0]: sp.Rational(1, 2), b[1]: sp.Rational(1, 2)}
    assert unique_linear([b[0] + b[1] - 1], list(b)) is None  # under-determined
    assert unique_linear([b[0] - 1, b[0] - 2], list(b[:1])) is None  # inconsistent


def test_affine_residuals_are_evaluated_as_coefficient_rows_with_the_general_paths_outcomes(monkeypatch):
    """Residuals affine in the unknowns by their form are evaluated as exact coefficient rows; the
    outcome (solution, fixed point, reason) is the general path's (substitute and expand) on a
    unique, an under-determined, an inconsistent and a parameter-dependent system, and a residual
    with a product of two unknown factors goes to the general path."""
    from gauge_audit.rules import solve

    b = sp.symbols("b0:3")
    x, y = sp.symbols("x y", real=True)
    w = sp.Symbol("w", positive=True)
    systems = {
        "unique": [
            (b[0] - 3) * x + (b[1] + sp.Rational(1, 2)) * y * w,
            (b[2] - 2) * x * y * w,
            x * (b[0] + b[1] - b[2] - sp.Rational(1, 2)),
        ],
        "under": [(b[0] + b[1] - 1) * x, (b[2] - 2) * y],
        "inconsistent": [(b[0] - 1) * x, (b[0] - 2) * x * y, b[1] * x, b[2] * y],
        "parameter": [(w * b[0] - 1) * x, (b[1] - w**2) * y + (b[2] - 1 / w) * x * y],
    }
    for name, res in systems.items():
        assert solve._compile_affine(res, list(b), sorted({x, y, w}, key=str)) is not None, name
        for fixed in (set(), {w}):
            fast = solve_sampled(res, list(b), fixed, random.Random(3), Budget(None))
            with monkeypatch.context() as mp:
                mp.setattr(solve, "_compile_affine", lambda *a: None)
                general = solve_sampled(res, list(b), fixed, random.Random(3), Budget(None))
            assert fast == general, (name, fixed, fast, general)
    sol, _, why = solve_sampled(systems["unique"], list(b), set(), random.Random(0), Budget(None))
    assert sol is not None and sol[b[0]] == 3 and sol[b[1]] == sp.Rational(-1, 2), why
    assert (
        "not unique (rank 2 of 3)" in solve_sampled(systems["under"], list(b), set(), random.Random(0), Budget(None))[2]
    )
    assert solve._compile_affine([(b[0] - 1) * (b[1] + x)], list(b), [x]) is None  # degree 2 by its form


def test_exact_value_at_an_integer_point_is_sympys():
    """The probe of the exact zero test: a rational function's value in integers and rationals equals
    SymPy's substitution; a function is not evaluated (None); a pole raises."""
    from sympy.external.gmpy import MPQ

    from gauge_audit.rules.solve import exact_value

    x, y = sp.symbols("x y", real=True)
    e = (x**2 - sp.Rational(3, 7) * y) / (x + 2 * y) ** 2 + x * y - 1 / x
    pt = {x: 3, y: -5}
    v = exact_value(e, pt)
    assert isinstance(v, MPQ) and sp.Rational(int(v.numerator), int(v.denominator)) == e.xreplace(pt)
    assert exact_value(sp.erf(x) + y, pt) is None
    with pytest.raises(ZeroDivisionError):
        exact_value(1 / (x + 2 * y + 7), pt)


def test_exact_zero_test_on_polynomials_rational_functions_and_functions():
    """is_zero decides exactly whatever the probe point says: polynomial identities in the
    polynomial ring, rational ones in the field of fractions, others by SymPy; a polynomial that
    vanishes on a hyperplane is still non-zero."""
    from gauge_audit.rules.symbolic.model import is_zero

    x, y, z = sp.symbols("x y z", real=True)
    assert is_zero((x + y) ** 3 - (x**3 + 3 * x**2 * y + 3 * x * y**2 + y**3))
    assert is_zero(sp.Rational(1, 3) * (x - z) * (x + z) - (x**2 - z**2) / 3)
    assert is_zero(1 / (x + y) - y / (x * y + y**2))
    assert is_zero(sp.erf(x) * y - y * sp.erf(x))
    assert not is_zero((x + y) ** 2 - x**2 - y**2)
    assert not is_zero(x / (x + 1) - 1)
    assert not is_zero(sp.erf(x) - x)


def test_inconsistent_and_oversized_polynomial_systems_are_reported_not_attempted():
    b = sp.symbols(f"b0:{POLY_LIMITS['unknowns'] + 1}")
    x = sp.Symbol("x", real=True)
    sol, _, why = solve_sampled([(b[0] - 1) * x + x**2], list(b[:1]), set(), random.Random(0), Budget(None))
    assert sol is None and why.startswith("inconsistent")
    quad = [sum(bi * bi for bi in b) * x - x]
    sol, _, why = solve_sampled(quad, list(b), set(), random.Random(0), Budget(None))
    assert sol is None and "exceeds the solver's size limit" in why


# ----------------------------------------------------------------------------- group sizes
def test_so1_rule_is_not_vacuous_at_symbolic_size():
    """At d_v = 2 SO1(2) = {I} and the rule (b_V left alone) 'held'; at the chosen size it fails like torch."""
    claim = _claim(SO1_NO_BIAS, {"family": "gpt2"}, ("gpt2-tiny",), checkers=("symbolic", "torch"))
    ctx = Context(seed=0)
    ev = {n: rc.run(n, claim, ctx) for n in claim.checkers}
    d = rc.derivation(claim, ctx)
    assert d.sizes["d_v"] >= 3
    assert ev["symbolic"].outcome in (FAILS, CORRECTED, NOT_APPLICABLE) and ev["symbolic"].outcome != HOLDS
    assert ev["symbolic"].outcome == ev["torch"].outcome, ev
    assert d.corrected_text == "b_V ↦ b_V @ N"


def test_a_group_trivial_at_its_stated_size_is_not_applicable():
    table = {**SO1_NO_BIAS, "elements": {"N": "SO1(2)"}}
    with pytest.raises(NotApplicable, match="trivial group"):
        rs.check(parse_rule(table), [config_of("gpt2-tiny")])


def test_permutations_of_two_would_hide_a_false_rule():
    """Every permutation of 2 is a symmetric involution (M² = I), so W_V·M, b_V·Mᵀ, M·W_O 'held' at d_v = 2."""
    r = rs.check(parse_rule(PERM_BV), [config_of("attn-tiny")])
    assert r.sizes["d_v"] >= 3 and not r.verdict_holds


# ----------------------------------------------------------------------------- audit --max-minutes
def test_audit_max_minutes_marks_the_checks_it_did_not_reach():
    claims = [
        Claim(
            f"c{i}",
            DOC,
            "budget",
            "x",
            "a rule",
            "symmetry",
            ("torch",),
            {},
            models=("attn-tiny",),
            rule=parse_rule(QK_SAME),
            expected="holds",
        )
        for i in range(2)
    ]
    report = audit(claims, Context(seed=0), max_minutes=0.0)
    for r in report.results:
        (e,) = r.evidence
        assert e.outcome == NOT_RUN and "--max-minutes" in e.summary
        assert r.verdict.verdict == UNDECIDED


def test_audit_max_minutes_rejects_a_bad_value(capsys):
    assert main(["audit", "--max-minutes", "-1", "--out", "/nonexistent/x"]) == 2
    assert "--max-minutes" in capsys.readouterr().err


def test_symbolic_product_skipping_zeros_is_sympys_product():
    """The symbolic checker's matrix product (exact zeros skipped) gives SymPy's own product entry
    for entry — on sparse symbolic matrices, an identity, a rotary block — and SymPy's 0·∞ = NaN
    where an infinity is present; a shape mismatch is one line."""
    from gauge_audit.errors import GaugeAuditError
    from gauge_audit.rules.algebra import sym_matmul

    rng = random.Random(7)
    xs = sp.symbols("x0:6", real=True)
    c, s = sp.symbols("c s", real=True)

    def entry():
        r = rng.random()
        if r < 0.5:
            return sp.Integer(0)
        if r < 0.7:
            return sp.Rational(rng.randint(-5, 5), rng.randint(1, 4))
        return rng.choice(xs) * rng.randint(-3, 3) + rng.choice(xs) ** 2 / (1 + rng.choice(xs) ** 2)

    for _ in range(40):
        n, k, m = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 4)
        a = sp.Matrix(n, k, lambda i, j: entry())
        b = sp.Matrix(k, m, lambda i, j: entry())
        assert sym_matmul(a, b) == a * b
    rot = sp.Matrix([[c, s, 0], [-s, c, 0], [0, 0, 1]])
    row = sp.Matrix([xs[:3]])
    assert sym_matmul(row, rot) == row * rot and sym_matmul(sp.eye(3), rot) == rot
    inf = sp.Matrix([[sp.zoo, 1], [2, xs[0]]])
    zero_col = sp.Matrix([[0, 1], [xs[1], 0]])
    assert sym_matmul(zero_col, inf).has(sp.nan) and sym_matmul(zero_col, inf) == zero_col * inf
    with pytest.raises(GaugeAuditError, match="shape mismatch"):
        sym_matmul(sp.ones(2, 3), sp.ones(2, 3))
