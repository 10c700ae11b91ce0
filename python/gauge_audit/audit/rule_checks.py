"""The four checkers on a claim that carries a ``[claim.rule]`` (see :mod:`gauge_audit.rules`).

Which architectures: the reference models of ``models`` (default: all) that match the claim's
``params`` (``family``, ``norm``, ``norm_affine``, ``tied``, ``activation``, ``pos``,
``norm_placement``, ...) and that the rule can act on.  Each checker then reports what it found
about the rule *as stated*; when it is not a symmetry and the claim says it is, the checker also
tests the corrected rule the SymPy derivation solves for (one derivation per claim and audit,
shared through the context — each checker verifies it independently, in its own arithmetic).

Verdict of a checker: the stated rule behaves as the source says (``expected``) → HOLDS.
Otherwise FAILS — unless the claim is of kind ``symmetry`` (it asserts that the group acts as a
symmetry) and the corrected rule, with the same group, holds: then HOLDS-WITH-CORRECTION.  A
claim of kind ``derivation`` asserts the rule itself, so a different rule refutes it (FAILS,
with the corrected rule reported) — as the catalog's qk-same-action and value-g3-eq-g0.
"""

from __future__ import annotations

from ..claims import Claim
from ..claims.rule import Rule
from ..errors import GaugeAuditError
from ..models import config_of, model_names
from ..numeric import HOLDS_WORST_CASE_ONLY
from ..rules import symbolic as rsym
from ..rules.budget import SYMBOLIC_SECONDS, Budget
from ..rules.engine import NotApplicable
from ..rules.torch_check import check_rule, models_for
from .evidence import CORRECTED, FAILS, HOLDS, NOT_APPLICABLE, NOT_RUN, UNDECIDED, Evidence, result_row
from .selection import matches_params as _matches


def _rule(claim: Claim) -> Rule:
    """The claim's rule: these checkers only see claims that carry one (see :mod:`.dispatch`)."""
    if claim.rule is None:  # pragma: no cover - the dispatch sends only rule claims here
        raise GaugeAuditError(f"internal: claim {claim.id} has no [claim.rule]")
    return claim.rule


def rule_models(claim: Claim) -> tuple[list[str], dict[str, str]]:
    """The reference models the rule is checked on, and why each other candidate is not."""
    names = list(claim.models) if claim.models else model_names()
    matching = [m for m in names if _matches(config_of(m), claim.params)]
    ok, skipped = models_for(_rule(claim), matching)
    return ok, skipped


def _want_holds(claim: Claim) -> bool:
    return claim.expected == "holds"


def _decide(
    checker: str,
    claim: Claim,
    stated_holds: bool,
    summary: str,
    details: dict,
    corrected_holds: bool | None = None,
    corrected_text: str | None = None,
    counter: str | None = None,
    search_note: str = "",
) -> Evidence:
    want = _want_holds(claim)
    if stated_holds != want and want and not corrected_holds:
        summary += search_note
    if stated_holds == want:
        return Evidence(checker, HOLDS, summary, details)
    if not want:
        return Evidence(
            checker,
            FAILS,
            summary + "; the source says it is not a symmetry",
            details,
            counterexample=counter or summary,
        )
    if corrected_holds and claim.kind == "symmetry":
        return Evidence(
            checker,
            CORRECTED,
            summary + f"; the corrected rule holds ({corrected_text})",
            details,
            corrected_rule=corrected_text,
            counterexample=counter,
        )
    if corrected_holds:
        summary += f"; the corrected rule {corrected_text} holds, but the claim asserts the rule itself"
    return Evidence(
        checker,
        FAILS,
        summary,
        details,
        corrected_rule=corrected_text if corrected_holds else None,
        counterexample=counter or summary,
    )


SECONDS_KEY = "rule-symbolic-seconds"  # ctx.cache: the symbolic searches' budget per claim (default SYMBOLIC_SECONDS)
DEADLINE_KEY = "audit-deadline"  # ctx.cache: time.monotonic() at which the whole audit's budget ends


def search_budget(ctx) -> Budget:
    """The symbolic searches' budget for one claim: the per-claim default (CPU seconds), and
    never past the audit's ``--max-minutes`` deadline."""
    return Budget(ctx.cache.get(SECONDS_KEY, SYMBOLIC_SECONDS), ctx.cache.get(DEADLINE_KEY))


def derivation(claim: Claim, ctx) -> rsym.SymbolicResult | None:
    """The SymPy decision (and derived correction) for the claim's rule, once per audit."""
    key = ("rule-symbolic", claim.id, claim.file)
    if key not in ctx.cache:
        models, _ = rule_models(claim)
        try:
            ctx.cache[key] = (
                rsym.check(
                    _rule(claim),
                    [config_of(m) for m in models],
                    search_budget(ctx),
                    nearest_search=_want_holds(claim),
                )
                if models
                else None
            )
        except NotApplicable:
            ctx.cache[key] = None
    return ctx.cache[key]


def _corrected(claim: Claim, ctx):
    d = derivation(claim, ctx) if _want_holds(claim) else None
    return (d.corrected, d.corrected_text) if d is not None and d.corrected is not None else (None, None)


def _nearest(claim: Claim, ctx):
    """The derived nearest true statement (its rule and text), or (None, None)."""
    d = derivation(claim, ctx) if _want_holds(claim) else None
    if d is None or d.nearest is None:
        return None, None
    return d.nearest.rule, d.nearest.statement()


def _with_nearest(ev: Evidence, text: str | None, holds: bool | None, how: str = "") -> Evidence:
    """The checker's re-check of the nearest true statement, in its evidence and its summary."""
    if text is None or holds is None:
        return ev
    ev.nearest = {"statement": text, "holds": holds}
    ev.summary += f"; nearest true statement ({text}) {'holds' if holds else 'does NOT hold'} here{how}"
    return ev


def _search_note(claim: Claim, ctx) -> str:
    """What the time budget cut in the correction search ('' if nothing): said next to a FAILS."""
    d = derivation(claim, ctx) if _want_holds(claim) else None
    if d is None or d.verdict_holds or d.corrected is not None:
        return ""
    cut = [c for c in d.budget_cut if c.startswith("no correction")]
    return (
        f"; {cut[0]}"
        if cut
        else f"; no correction found ({len(d.search)} slot(s) tried, every one within the search's size limits)"
    )


# ----------------------------------------------------------------------------- symbolic
def symbolic(claim: Claim, ctx) -> Evidence:
    d = derivation(claim, ctx)
    if d is None:
        return Evidence("symbolic", NOT_APPLICABLE, "the rule applies to no architecture class at symbolic size")
    q = rsym.quantities(d.per_arch)
    quant = ", ".join(f"{k} {'invariant' if v else 'NOT invariant'}" for k, v in q.items())
    details = {**d.to_json(), "quantities": q}
    if d.verdict_holds:
        return _decide(
            "symbolic",
            claim,
            True,
            f"exact at generic elements on {len(d.per_arch)} block(s): {quant}",
            details,
            counter="the rule leaves scores, attention output and block output unchanged",
        )
    summary = f"{quant}"
    for note in d.size_dependent:
        summary += f"; {note}"
    if d.condition:
        summary += f"; {d.condition}"
    if d.corrected_text:
        summary += f"; solved correction: {d.corrected_text}"
    for cut in d.budget_cut:
        summary += f"; {cut}"
    if not d.corrected_text and not any(c.startswith("no correction") for c in d.budget_cut) and _want_holds(claim):
        summary += f"; no correction found ({len(d.search)} slot(s) tried within the search's size limits)"
    if _want_holds(claim) and d.nearest is None and not d.corrected_text:
        summary += (
            "; no nearest true statement within the budget"
            if any("nearest" in c for c in d.budget_cut)
            else f"; no nearest true statement among {len(d.nearest_search)} subgroup trial(s)"
        )
    ev = _decide(
        "symbolic", claim, False, summary, details, d.corrected is not None, d.corrected_text, d.counterexample
    )
    if d.nearest is not None:
        ev = _with_nearest(ev, d.nearest.statement(), True, " (exact, at both symbolic sizes)")
        ev.nearest = {**d.nearest.to_json([d.sizes, d.sizes_second]), "holds": True}
    return ev


# ----------------------------------------------------------------------------- torch
def _run(rule, names, ctx, label) -> list:
    return [check_rule(ctx.model(m), rule, ctx.inputs(m), seed=ctx.seed, label=label) for m in names]


def torch(claim: Claim, ctx) -> Evidence:
    models, skipped = rule_models(claim)
    if not models:
        return Evidence(
            "torch",
            NOT_APPLICABLE,
            "the rule applies to no reference model matching the claim's params",
            {"not_applicable": skipped},
        )
    results = _run(claim.rule, models, ctx, claim.id)
    measured = {r.holds for r in results}
    details = {"results": [result_row(r) for r in results], "not_applicable": skipped}
    if len(measured) > 1:
        good = [r.model for r in results if r.holds]
        bad = [r.model for r in results if not r.holds]
        return Evidence(
            "torch",
            UNDECIDED,
            f"the rule holds on {', '.join(good)} but fails on {', '.join(bad)} "
            "(restrict params to the architectures the claim is about)",
            details,
        )
    worst = max(results, key=lambda r: r.max_rel_error)
    holds = measured == {True}
    summary = (
        f"rule {'HOLDS' if holds else 'FAILS'} on {len(results)} model(s); max error {worst.max_rel_error:.2e} "
        f"({worst.residual_eps:.3g} ε, κ {worst.kappa:.3g}) vs tol {worst.tolerance_statistical_eps:.3g} ε "
        f"statistical, {worst.tolerance_eps:.3g} ε worst-case"
    )
    weak = [r.model for r in results if r.verdict == HOLDS_WORST_CASE_ONLY]
    if weak:
        summary += f"; within the worst-case bound only on {', '.join(weak)}"
    counter = (
        None
        if holds
        else (
            f"{worst.model}, seed {worst.seed}: the rule changes the output by "
            f"{worst.max_rel_error:.3e} relative ({worst.residual_eps:.3g} ε)"
        )
    )
    corr, text = (None, None) if holds else _corrected(claim, ctx)
    corr_ok, how = _run_other(corr, "corrected", models, ctx, claim, details)
    if corr_ok:
        details["corrected_summary"] = how.strip(" ()")
    ev = _decide(
        "torch", claim, holds, summary, details, corr_ok, text, counter, "" if holds else _search_note(claim, ctx)
    )
    near, near_text = (None, None) if holds or corr_ok else _nearest(claim, ctx)
    near_ok, how = _run_other(near, "nearest", models, ctx, claim, details)
    return _with_nearest(ev, near_text, near_ok, how)


def _run_other(rule, key: str, models, ctx, claim: Claim, details: dict) -> tuple[bool | None, str]:
    """The torch check of a derived rule (the corrected one, the nearest statement) on the claim's
    models, into ``details[key]``: (whether it holds on every model — None when there is no rule or
    it does not apply —, the worst residual as text)."""
    if rule is None:
        return None, ""
    try:
        rows = _run(rule, models, ctx, f"{claim.id} ({key})")
    except NotApplicable as exc:
        details[f"{key}_not_applicable"] = str(exc)
        return None, ""
    details[key] = [result_row(r) for r in rows]
    w = max(rows, key=lambda r: r.max_rel_error)
    return all(r.holds for r in rows), f" (max {w.residual_eps:.3g} ε, tol {w.tolerance_statistical_eps:.3g} ε)"


# ----------------------------------------------------------------------------- precision
def precision(claim: Claim, ctx) -> Evidence:
    from ..rules import precision as rp

    models, _ = rule_models(claim)
    tiny = [m for m in models if m != "minilm"]
    if not tiny:
        return Evidence("precision", NOT_APPLICABLE, "the rule applies to no tiny reference model")
    corr, text = _corrected(claim, ctx)
    r = rp.check(_rule(claim), rp.default_model(_rule(claim), tiny), seed=ctx.seed, corrected=corr)
    if r.verdict == "INCONCLUSIVE":
        return Evidence("precision", UNDECIDED, f"residuals neither within κ·L·K·u nor O(1) on {r.model}", r.to_json())
    res = ", ".join(f"dps {x.dps}: {x.residual:.2e} (bound {x.bound:.1e})" for x in r.residuals)
    summary = f"rule {r.verdict} on {r.model} ({res})"
    counter = None
    if r.certificate:
        c = r.certificate
        summary += (
            f"; certified: y′−y ∈ [{c['interval'][0]}, {c['interval'][1]}] excludes 0 "
            f"({c['entries_excluding_zero']}/{c['entries']} entries, {c['model']})"
        )
        counter = (
            f"{c['model']}, {c['element']}: output entry {tuple(c['entry'])} ∈ [{c['interval'][0]}, {c['interval'][1]}]"
        )
        if c.get("control_rule"):
            summary += f"; corrected rule on the same data: every interval contains 0: {c['control_contains_zero']}"
    corr_ok = None
    if corr is not None and r.verdict == "FAILS":
        try:
            rc = rp.check(corr, r.model, seed=ctx.seed, certify=False)
            corr_ok = rc.verdict == "HOLDS"
        except NotApplicable:
            corr_ok = None
    ev = _decide(
        "precision",
        claim,
        r.verdict == "HOLDS",
        summary,
        r.to_json(),
        corr_ok,
        text,
        counter,
        "" if r.verdict == "HOLDS" else _search_note(claim, ctx),
    )
    near, near_text = (None, None) if r.verdict == "HOLDS" or corr_ok else _nearest(claim, ctx)
    if near is not None:
        try:
            rn_ = rp.check(near, r.model, seed=ctx.seed, certify=False)
        except NotApplicable:
            return ev
        worst = max(rn_.residuals, key=lambda x: x.residual / x.bound) if rn_.residuals else None
        how = f" ({r.model}, dps {worst.dps}: {worst.residual:.2e} ≤ bound {worst.bound:.1e})" if worst else ""
        return _with_nearest(ev, near_text, rn_.verdict == "HOLDS", how if rn_.verdict == "HOLDS" else "")
    return ev


# ----------------------------------------------------------------------------- nullity
def nullity(claim: Claim, ctx) -> Evidence:
    from ..rules import nullity as rn
    from .nullity_checks import DEFAULT, FULL_ONLY, _analyze, configs, generic_config

    if not any(e.continuous for e in _rule(claim).elements):
        return Evidence("nullity", NOT_APPLICABLE, "a finite group (permutations) has no generators")
    cands = [(n, c) for n, c in configs().items() if n in DEFAULT + (FULL_ONLY if ctx.full else ())]
    from ..models import param_shapes
    from ..rules.torch_check import reason

    pick = next(
        ((n, c) for n, c in cands if _matches(c, claim.params) and reason(_rule(claim), c, param_shapes(c)) is None),
        None,
    )
    if pick is None:
        return Evidence("nullity", NOT_APPLICABLE, "no small nullity configuration matches the claim and the rule")
    cfg = generic_config(pick[1])
    report = _analyze(ctx, pick[0]) if cfg == pick[1] else _analyze(ctx, f"{pick[0]} (generic sizes)", cfg)
    try:
        r = rn.check(_rule(claim), report, seed=ctx.seed)
    except NotApplicable as exc:
        return Evidence("nullity", NOT_APPLICABLE, str(exc))
    where = ", ".join(r.contained_in) if r.contained_in else "the union of the explained families"
    summary = f"{r.config}: {r.generators} generators (rank {r.rank}) " + (
        f"flat (max ‖J·v‖/(‖v‖·‖J‖_F) = {r.max_residual_rel:.1e} ≤ {r.tolerance_rel:.1e})"
        if r.flat
        else f"NOT flat (max ‖J·v‖/(‖v‖·‖J‖_F) = {r.max_residual_rel:.2e} > {r.tolerance_rel:.1e})"
    )
    if r.flat:
        summary += (
            f"; {r.new_directions} new direction(s) beyond the explained families (unexplained nullity "
            f"{r.unexplained_before} → {r.unexplained_after})"
            if r.new_directions
            else f"; nothing new: inside {where} (measured nullity {r.measured_nullity} = explained {r.explained})"
        )
    corr, text = (None, None) if r.flat else _corrected(claim, ctx)
    corr_ok = None
    if corr is not None:
        try:
            corr_ok = rn.check(corr, report, seed=ctx.seed).flat
        except NotApplicable:
            corr_ok = None
    ev = _decide(
        "nullity",
        claim,
        r.flat,
        summary,
        r.to_json(),
        corr_ok,
        text,
        None if r.flat else summary,
        "" if r.flat else _search_note(claim, ctx),
    )
    near, near_text = (None, None) if r.flat or corr_ok else _nearest(claim, ctx)
    if near is not None:
        try:
            rn_ = rn.check(near, report, seed=ctx.seed)
        except NotApplicable:
            return ev
        ev.details["nearest"] = rn_.to_json()
        return _with_nearest(
            ev,
            near_text,
            rn_.flat,
            f" ({r.config}: its {rn_.generators} generators span {rn_.rank} flat direction(s), "
            f"max ‖J·v‖/(‖v‖·‖J‖_F) = {rn_.max_residual_rel:.1e})",
        )
    return ev


def lean(claim: Claim, ctx) -> Evidence:
    return Evidence(
        "lean",
        NOT_RUN,
        "a rule from a claim file has no Lean theorem (Lean evidence exists for the built-in catalog's claims only)",
    )


RULE_CHECKERS = {"symbolic": symbolic, "torch": torch, "precision": precision, "nullity": nullity, "lean": lean}


def run(name: str, claim: Claim, ctx) -> Evidence:
    try:
        return RULE_CHECKERS[name](claim, ctx)
    except NotApplicable as exc:
        return Evidence(name, NOT_APPLICABLE, str(exc))


__all__ = ["DEADLINE_KEY", "RULE_CHECKERS", "SECONDS_KEY", "derivation", "rule_models", "run", "search_budget"]
