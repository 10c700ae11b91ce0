"""Random well-formed rules from the grammar, most of them false, each settled by every rule checker
(symbolic, precision, torch, nullity) within its budget: a decided verdict, or an honest record of
what the budget cut — never a hang, never a pass on a rule the other checkers refute.

The rules act on one attention layer with biases (attn-tiny; the symbolic block d_model 3,
d_k = d_v = 2, or 3 for SO1): an element of a random group on d_k or d_v (or a translation) and one
to three maps built from the templates of the grammar (a factor X, Xᵀ, X⁻¹, X⁻ᵀ, diag(s),
diag(s)⁻¹ on either side, a bias increment ±c or −c·W_O).  The symbolic searches run under a
reduced per-claim budget so the whole test stays short; every rule's time is asserted against
that budget plus the stated rule's own, size-bounded decision.

The rules are checked in two halves (every other rule), each one module fixture, so that the two
test workers share the work (tests/conftest.py gives each half its own group); every assertion
holds for each half, so it holds for the whole set."""

from __future__ import annotations

import os
import random
import time

import pytest

from gauge_audit.audit import rule_checks as rc
from gauge_audit.audit.checkers import Context
from gauge_audit.audit.evidence import DECIDING, NOT_APPLICABLE
from gauge_audit.claims import Claim, Document
from gauge_audit.claims.rule import parse_rule
from gauge_audit.errors import GaugeAuditError

SEED = 20261201
N_RULES = int(os.environ.get("GAUGE_AUDIT_FUZZ_RULES", 300))
SEARCH_SECONDS = 0.2  # the symbolic searches' budget per claim in this test (default 20 s)
# one claim, all four checkers: the stated rule's exact decision on a 3-dimensional attention block, the
# torch / mpmath / Jacobian checks of a tiny model, plus the searches' budget.  Measured in CPU seconds of
# this process (the budget's own clock), so a busy machine does not move it: a hang detector, not a speed test
MARGIN_SECONDS = 30.0
CHECKERS = ("symbolic", "precision", "torch", "nullity")
DOC = Document("fuzz", "random rules", (), "tests/test_rules_fuzz_budget.py", "fuzz.toml")

_MATRIX_GROUPS = ("GL", "O", "SO", "SO1", "permutation")
_VECTOR_GROUPS = ("diagonal", "positive-diagonal")
_SIDE = {
    "W_Q": ("d_k", "right"),
    "W_K": ("d_k", "right"),
    "b_Q": ("d_k", "right"),
    "b_K": ("d_k", "right"),
    "W_V": ("d_v", "right"),
    "b_V": ("d_v", "right"),
    "W_O": ("d_v", "left"),
}


def _factor(kind: str, sym: str, rng: random.Random) -> str:
    if kind == "matrix":
        return rng.choice([sym, f"transpose({sym})", f"inv({sym})", f"inv(transpose({sym}))"])
    return rng.choice([f"diag({sym})", f"inv(diag({sym}))"])


def random_rule(rng: random.Random) -> dict:
    """One rule table: an element on d_k or d_v and 1–3 maps of the parameters that dimension meets."""
    dim = rng.choice(["d_k", "d_v"])
    roll = rng.random()
    if roll < 0.2:
        sym, group, kind = "c", f"translation({dim})", "translation"
    elif roll < 0.4:
        sym, group, kind = "s", f"{rng.choice(_VECTOR_GROUPS)}({dim})", "vector"
    else:
        sym, group, kind = "M", f"{rng.choice(_MATRIX_GROUPS)}({dim})", "matrix"
    params = [p for p, (d, _) in _SIDE.items() if d == dim]
    chosen = rng.sample(params, rng.randint(1, min(3, len(params))))
    maps = {}
    for p in chosen:
        if kind == "translation":
            if p.startswith("b_"):
                maps[p] = rng.choice([f"{p} + c", f"{p} - c"])
            elif p == "W_O":
                maps["b_O"] = "b_O - c @ W_O"
            else:
                maps["b_" + p[2:]] = f"b_{p[2:]} + c"
            continue
        f = _factor(kind, sym, rng)
        maps[p] = f"{f} @ {p}" if _SIDE[p][1] == "left" else f"{p} @ {f}"
    return {"scope": "head", "elements": {sym: group}, "maps": maps}


def _claims(n: int) -> list[Claim]:
    rng = random.Random(SEED)
    out, seen = [], set()
    while len(out) < n:
        table = random_rule(rng)
        key = repr(sorted(table["maps"].items())) + repr(table["elements"])
        if key in seen:
            continue
        seen.add(key)
        try:
            rule = parse_rule(table)
        except GaugeAuditError as exc:  # the generator only writes well-formed rules
            raise AssertionError(f"generated an ill-formed rule {table}: {exc}") from exc
        out.append(
            Claim(
                f"fuzz-{len(out)}",
                DOC,
                "fuzz",
                "random",
                f"rule {table['maps']}",
                "symmetry",
                CHECKERS,
                {"family": "attn"},
                models=("attn-tiny",),
                rule=rule,
                expected="holds",
            )
        )
    return out


HALVES = 2


@pytest.fixture(scope="module", params=range(HALVES), ids=lambda i: f"half{i}")
def fuzz_results(request):
    ctx = Context(seed=0)
    ctx.cache[rc.SECONDS_KEY] = SEARCH_SECONDS
    rows = []
    per_checker = PER_CHECKER.setdefault(request.param, {})
    for claim in _claims(N_RULES)[request.param :: HALVES]:
        t = time.process_time()
        evidence = []
        for name in CHECKERS:
            t0 = time.process_time()
            evidence.append(rc.run(name, claim, ctx))
            per_checker[name] = per_checker.get(name, 0.0) + time.process_time() - t0
        rows.append((claim, evidence, time.process_time() - t, rc.derivation(claim, ctx)))
    return rows


PER_CHECKER: dict = {}


def _half(request) -> int:
    return request.node.callspec.params["fuzz_results"]


def test_fuzz_generates_enough_distinct_rules_many_false(fuzz_results, request):
    """≥ 300 distinct rules (the generator skips repeats), each in one half; most of each half false."""
    claims = _claims(N_RULES)
    assert len(claims) >= 300
    assert [c.id for c, *_ in fuzz_results] == [c.id for c in claims[_half(request) :: HALVES]]
    false = [c for c, ev, _, _ in fuzz_results if next(e for e in ev if e.checker == "torch").outcome != "HOLDS"]
    assert len(false) >= len(fuzz_results) // 2, len(false)


def test_fuzz_every_checker_settles_every_rule(fuzz_results):
    """Each checker decides, or says why not: NOT-APPLICABLE with its reason, or the precision
    checker's UNDECIDED when the residuals are neither within the bound nor O(1) (the torch checker's
    split between models cannot occur with one model)."""
    for claim, evidence, _, _ in fuzz_results:
        for e in evidence:
            honest = (e.outcome == NOT_APPLICABLE and e.summary) or (
                e.checker == "precision" and e.outcome == "UNDECIDED" and "neither within" in e.summary
            )
            assert e.outcome in DECIDING or honest, (claim.rule.text(), e)


def test_fuzz_budget_cuts_are_recorded_next_to_the_stated_verdict(fuzz_results):
    """A search the budget stopped leaves the stated rule's verdict (FAILS, with a counterexample)
    and says what it did not find, in the symbolic evidence and in the others' FAILS."""
    cut = 0
    for claim, evidence, _, d in fuzz_results:
        if d is None or not d.budget_cut:
            continue
        cut += 1
        assert not d.verdict_holds and d.counterexample, claim.rule.text()
        sym = next(e for e in evidence if e.checker == "symbolic")
        assert all(c in sym.summary for c in d.budget_cut), sym.summary
        for e in evidence:
            if (
                e.outcome == "FAILS"
                and e.checker != "symbolic"
                and any(c.startswith("no correction") for c in d.budget_cut)
            ):
                assert "no correction found " in e.summary, e.summary
    assert cut > 0  # the reduced budget must actually bind somewhere, or this test tests nothing


def test_fuzz_no_rule_exceeds_its_budget(fuzz_results):
    worst = max(fuzz_results, key=lambda r: r[2])
    assert worst[2] <= SEARCH_SECONDS + MARGIN_SECONDS, (worst[0].rule.text(), worst[2])


def test_fuzz_symbolic_never_holds_where_torch_fails(fuzz_results):
    """The exact symbolic decision and the torch measurement agree on the stated rule (the vacuous
    HOLDS of a trivial group at a too-small size would show up here)."""
    for claim, evidence, _, _ in fuzz_results:
        by = {e.checker: e for e in evidence}
        sym, tor = by["symbolic"], by["torch"]
        if sym.outcome == "HOLDS":
            assert tor.outcome == "HOLDS", (claim.rule.text(), sym.summary, tor.summary)


def test_fuzz_report_numbers(fuzz_results, capsys, request):
    """Not an assertion about speed: prints rules, verdict counts and the slowest rule for the log."""
    counts: dict = {}
    for _, evidence, _, _ in fuzz_results:
        for e in evidence:
            counts[(e.checker, e.outcome)] = counts.get((e.checker, e.outcome), 0) + 1
    cut = sum(1 for *_, d in fuzz_results if d is not None and d.budget_cut)
    per_checker = PER_CHECKER[_half(request)]
    with capsys.disabled():
        print(
            f"\nfuzz, half {_half(request)}: {len(fuzz_results)} rules, "
            f"max {max(r[2] for r in fuzz_results):.2f} s per rule, "
            f"total {sum(r[2] for r in fuzz_results):.1f} s, budget cut {cut}; seconds per checker "
            + ", ".join(f"{k} {v:.1f}" for k, v in per_checker.items())
            + "; "
            + ", ".join(f"{c} {o} {n}" for (c, o), n in sorted(counts.items()))
        )
