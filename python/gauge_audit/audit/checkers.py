"""One function per checker: claim → :class:`Evidence`.

Each checker reports what it measured or proved about the claim *as the source
states it*; none of them looks at another checker's outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import formal
from ..actions import get_action
from ..claims import Claim
from ..errors import GaugeAuditError
from ..experiments import EXPERIMENTS
from ..models import Model, build, config_of, model_names
from ..models.registry import REAL, UNTIED
from ..numeric import HOLDS_WORST_CASE_ONLY, CheckResult, check
from .evidence import CORRECTED, ERROR, FAILS, HOLDS, NOT_APPLICABLE, NOT_RUN, UNDECIDED, Evidence, result_row
from .selection import matches_params

# Sequences of 16 tokens per check of a real checkpoint in the default audit, an action's and a
# rule's alike (``--full``: the four of every other model).  The forwards are most of the audit's
# time (Gemma 3's 262 144-row unembedding above all), and two decide as well as four: a true action
# stays hundreds of times below its derived tolerance, a false one changes the logits by O(1),
# ~10¹⁵ ε.
REAL_SEQUENCES = 2


@dataclass
class Context:
    """Shared state of one audit run: seed, device, depth, caches."""

    seed: int = 0
    device: str = "cpu"
    full: bool = False
    models: dict[str, Model] = field(default_factory=dict)
    lake: dict = field(default_factory=dict)  # cached `lake build` outcome
    cache: dict = field(default_factory=dict)  # checker-specific shared results (error study, ...)
    checks: dict = field(default_factory=dict)  # (model, action) -> the torch check at this seed
    refused: dict = field(default_factory=dict)  # (model, action) -> why that check cannot run (its error's lines)

    def model(self, name: str) -> Model:
        if name not in self.models:
            self.models[name] = build(name, seed=self.seed, device=self.device)
        return self.models[name]

    def check(self, name: str, action: str) -> CheckResult:
        """The torch check of ``action`` on model ``name`` at the run's seed, measured once per run:
        several claims name the same action (qk-gl on its own and as a corrected rule), and the
        check is deterministic in the seed (treat the result as read-only)."""
        if (name, action) in self.refused:
            raise GaugeAuditError(*self.refused[name, action])
        if (name, action) not in self.checks:
            self.checks[name, action] = check(self.model(name), action, self.inputs(name), seed=self.seed)
        return self.checks[name, action]

    def inputs(self, name: str) -> dict | None:
        """The inputs of a check on model ``name``: REAL_SEQUENCES sequences for a real checkpoint
        in the default audit, else None (the checks draw the model's four)."""
        if (name in REAL or name in UNTIED) and not self.full:
            return self.model(name).sample_inputs(self.seed, batch=REAL_SEQUENCES)
        return None


# ----------------------------------------------------------------------------- lean
def lean(claim: Claim, ctx: Context) -> Evidence:
    thms = [t for t in formal.theorems() if claim.id in t.claims]
    if not thms:
        return Evidence("lean", NOT_RUN, "no Lean theorem names this claim")
    names = ", ".join(t.name.split(".")[-1] for t in thms)
    details: dict[str, Any] = {"theorems": [t.name for t in thms], "files": sorted({t.file for t in thms})}
    if formal.lake_path() is None:
        return Evidence(
            "lean",
            NOT_RUN,
            f"{len(thms)} theorem(s) ({names}); not machine-checked here: "
            "`lake` is not on PATH (CI workflow .github/workflows/lean.yml checks them)",
            details,
        )
    if "result" not in ctx.lake:
        try:
            proc = formal.lake_build()
            ctx.lake["result"] = (proc.returncode, (proc.stdout + proc.stderr)[-2000:])
        except Exception as exc:  # a broken toolchain must not stop the audit
            ctx.lake["result"] = (-1, str(exc))
    rc, log = ctx.lake["result"]
    if rc != 0:
        return Evidence(
            "lean",
            ERROR,
            f"`lake build` failed (exit {rc}); {len(thms)} theorem(s) unchecked",
            {**details, "log_tail": log},
        )
    roles = {t.roles.get(claim.id, "establishes") for t in thms}
    details["roles"] = {t.name: t.roles.get(claim.id, "establishes") for t in thms}
    outcome = (
        CORRECTED
        if "corrects" in roles
        else FAILS
        if "refutes" in roles
        else HOLDS
        if "establishes" in roles
        else UNDECIDED
    )
    return Evidence("lean", outcome, f"`lake build` checked {len(thms)} theorem(s): {names}", details)


# ----------------------------------------------------------------------------- symbolic
def symbolic(claim: Claim, ctx: Context) -> Evidence:
    from ..symbolic import DERIVATIONS

    if claim.id not in DERIVATIONS:
        return Evidence("symbolic", NOT_RUN, "no SymPy derivation for this claim")
    d = DERIVATIONS[claim.id]()
    summary = f"derived: {d.derived}" if d.derived else "derivation done"
    if d.residual not in ("", "0"):
        summary += f"; residual of the claimed rule: {d.residual}"
    return Evidence(
        "symbolic",
        d.verdict,
        summary,
        {"derived": d.derived, "residual": d.residual, "steps": list(d.steps), "data": _jsonable(d.data)},
        corrected_rule=d.corrected_rule,
        counterexample=d.counterexample,
    )


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return str(x)


# ----------------------------------------------------------------------------- torch
def _candidates(claim: Claim) -> list[str]:
    """The claim's models, or every model; untied copies of real checkpoints (smollm2-untied) only
    for claims about untied models — elsewhere they would repeat the tied original."""
    if claim.models:
        return list(claim.models)
    return [m for m in model_names() if m not in UNTIED or claim.params.get("tied") is False]


def torch_models(claim: Claim) -> list[str]:
    action = get_action(claim.action)
    return [
        m
        for m in _candidates(claim)
        if action.applies(config_of(m)) is None and matches_params(config_of(m), claim.params)
    ]


def _real_excluded(claim: Claim, used: list[str]) -> dict[str, str]:
    """Why a real checkpoint is not among the models (e.g. the tied-embedding caveat of the rotation)."""
    action, out = get_action(claim.action), {}
    for m in REAL:
        if m in used or (claim.models and m not in claim.models):
            continue
        out[m] = action.applies(config_of(m)) or "the claim's parameters select other architectures"
    return out


def _experiment(claim: Claim) -> bool:
    """A catalog claim settled by an experiment (several actions, enumerations, losses); a user's
    claim that happens to reuse the id is not."""
    return (
        claim.id in EXPERIMENTS
        and not claim.action
        and claim.file.startswith("claims/")
        and "/examples/" not in claim.file
    )


def torch_pairs(claim: Claim) -> list[tuple[str, str]] | None:
    """The (model, action) checks :func:`torch` reads from :meth:`Context.check` for ``claim``
    (its action, and its corrected action where the models admit it), so that they can be measured
    ahead, elsewhere; None where the checker does other work (an experiment)."""
    if _experiment(claim):
        return None
    if not claim.action:
        return []
    models = torch_models(claim)
    pairs = [(m, claim.action) for m in models]
    if claim.corrected_action:
        fix = get_action(claim.corrected_action)
        pairs += [(m, fix.name) for m in models if fix.applies(config_of(m)) is None]
    return pairs


def torch(claim: Claim, ctx: Context) -> Evidence:
    if _experiment(claim):
        f = EXPERIMENTS[claim.id](ctx.seed, ctx.full)
        return Evidence(
            "torch",
            f.outcome,
            f.summary,
            _jsonable(f.details),
            corrected_rule=f.corrected_rule,
            counterexample=f.counterexample,
        )
    if not claim.action:
        return Evidence("torch", NOT_APPLICABLE, "the claim names no gauge action")
    models = torch_models(claim)
    if not models:
        return Evidence(
            "torch",
            NOT_APPLICABLE,
            f"action {claim.action} applies to no reference model matching the claim's parameters",
        )
    results = [ctx.check(m, claim.action) for m in models]
    rows = [result_row(r) for r in results]
    measured = {"HOLDS" if r.holds else "FAILS" for r in results}
    want = "HOLDS" if claim.expected == "holds" else "FAILS"
    worst = max(results, key=lambda r: r.max_rel_error)
    details: dict[str, Any] = {
        "action": claim.action,
        "expected_by_source": want,
        "results": rows,
        "real_weights": [m for m in models if m in REAL or m in UNTIED],
    }
    excluded = _real_excluded(claim, models)
    if excluded:
        details["real_not_applicable"] = excluded
    if any(r.routing_changed for r in results if r.holds):
        return Evidence("torch", ERROR, "top-k routing changed under a true action", details)
    real = f" (real weights: {', '.join(details['real_weights'])})" if details["real_weights"] else ""
    if measured == {want}:
        summary = (
            f"{claim.action} {want} on {len(models)} model(s){real} as claimed; max error "
            f"{worst.max_rel_error:.2e} ({worst.residual_eps:.3g} ε) vs tol {worst.tolerance_statistical_eps:.3g} "
            f"ε statistical, {worst.tolerance_eps:.3g} ε worst-case"
        )
        weak = [r.model for r in results if r.verdict == HOLDS_WORST_CASE_ONLY]
        if weak:
            summary += (
                f"; within the worst-case bound only on {', '.join(weak)} (an error larger than independent "
                "roundings explain)"
            )
        if want == "FAILS" and claim.corrected_action:
            fix = _corrected(claim, ctx, models, details)
            if fix is not None:
                return Evidence(
                    "torch",
                    CORRECTED,
                    summary + f"; but {fix}",
                    details,
                    corrected_rule=_first_line(get_action(claim.corrected_action).doc),
                )
        return Evidence("torch", HOLDS, summary, details)
    if len(measured) > 1:
        return Evidence("torch", UNDECIDED, f"{claim.action} holds on some models and fails on others", details)
    # a rule that holds everywhere: the first model names it (the smallest residual would be
    # picked by the processor's last bits, all of them being at the rounding level)
    bad = worst if want == "HOLDS" else results[0]
    counter = (
        f"{bad.model}, seed {bad.seed}: {claim.action} changes the output by {bad.max_rel_error:.3e} relative"
        if want == "HOLDS"
        else f"{bad.model}, seed {bad.seed}: {claim.action} leaves the output unchanged to "
        f"{bad.residual_eps:.3g} ε (tol {bad.tolerance_statistical_eps:.3g} ε statistical, "
        f"{bad.tolerance_eps:.3g} ε worst-case)"
    )
    summary = f"{claim.action} {bad.verdict} on {len(models)} model(s), the source says {want}: {counter}"
    if claim.corrected_action and want == "HOLDS":
        fix = _corrected(claim, ctx, models, details)
        if fix is not None:
            return Evidence(
                "torch",
                CORRECTED,
                summary + f"; {fix}",
                details,
                corrected_rule=_first_line(get_action(claim.corrected_action).doc),
                counterexample=counter,
            )
    return Evidence("torch", FAILS, summary, details, counterexample=counter)


def _corrected(claim: Claim, ctx: Context, models: list[str], details: dict) -> str | None:
    fix = get_action(claim.corrected_action)
    usable = [m for m in models if fix.applies(config_of(m)) is None]
    if not usable:
        return None
    fixed = [ctx.check(m, fix.name) for m in usable]
    details["corrected"] = [result_row(r) for r in fixed]
    if all(r.holds for r in fixed):
        worst = max(fixed, key=lambda r: r.max_rel_error)
        return (
            f"the corrected rule {fix.name} {worst.verdict} on {len(usable)} model(s) "
            f"(max {worst.residual_eps:.3g} ε; tol {worst.tolerance_statistical_eps:.3g} ε statistical, "
            f"{worst.tolerance_eps:.3g} ε worst-case)"
        )
    return None


def _first_line(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())


# ----------------------------------------------------------------------------- precision
def precision(claim: Claim, ctx: Context) -> Evidence:
    """mpmath at dps 30/50/100, interval certificates, the referee test, the error study."""
    from ..precision import verdicts as pv
    from ..precision.residual import check_action

    if claim.id in pv.CLAIMS:
        v = pv.claim_verdict(claim.id, seed=ctx.seed, full=ctx.full)
        if claim.id in pv.STUDY_CLAIMS:
            ctx.cache["error_study"] = pv.study_for(ctx.seed, ctx.full)  # the report plots it (computed once)
        outcome = v.verdict if v.verdict in (HOLDS, FAILS, CORRECTED) else UNDECIDED
        counter = v.summary if outcome == FAILS else None
        return Evidence(
            "precision", outcome, v.summary, _jsonable(v.evidence), corrected_rule=v.corrected, counterexample=counter
        )
    if not claim.action:
        return Evidence("precision", NOT_APPLICABLE, "no high-precision check for this claim and no action named")
    # A user's claim: the named action at dps 30/50/100 on its default tiny model.
    r = check_action(claim.action, seed=ctx.seed)
    want = HOLDS if claim.expected == "holds" else FAILS
    res = ", ".join(f"dps {x.dps}: {x.residual:.2e}" for x in r.residuals)
    outcome = HOLDS if r.verdict == want else FAILS
    return Evidence(
        "precision",
        outcome,
        f"{claim.action} on {r.model} {r.verdict} ({res}); the source says {want}",
        _jsonable(r.to_json()),
    )


def nullity(claim: Claim, ctx: Context) -> Evidence:
    """Jacobian nullity of small models, explained by symmetry families (see nullity_checks)."""
    from .nullity_checks import nullity as run

    return run(claim, ctx)
