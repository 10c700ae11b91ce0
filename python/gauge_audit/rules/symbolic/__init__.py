"""The symbolic checker on a rule: SymPy decides invariance for a generic group element, and when
the rule is wrong it solves for the correction.

This module runs the check (:func:`check`); its parts: the symbolic block (:mod:`.model`), the
generic elements (:mod:`.elements`), the invariance identities (:mod:`.interfaces`), naming a
solved matrix in the rule language (:mod:`.naming`), the correction search (:mod:`.corrections`)
and the conditions and counterexamples (:mod:`.counterexamples`).

The model is one block of each architecture class the claim applies to, every parameter and
every datum an independent symbol (d_model = 3, d_k = d_v = 2, d_ff = 2; one query head per KV
head, or two for GQA; one expert and a two-way router for MoE), each dimension raised to the least
size at which every declared group on it is non-trivial and not special (SO1(n) and
permutation(n) need n ≥ 3 — every permutation of 2 is a symmetric involution —, SO(n) n ≥ 2); a
group that is trivial at its stated size is NOT-APPLICABLE, not a vacuous HOLDS.  The group element is *generic*:
an exact random rational point of every connected component of the declared group (a random
integer matrix for GL and its reflection for the other determinant sign; the Cayley transform
(I − A)(I + A)⁻¹ of a random rational skew A for SO, with A·1 = 0 for SO1, and its reflection
for O; every sign pattern of a diagonal; every permutation), drawn twice independently.  An
identity that holds at such a point holds for the generic element up to the Schwartz–Zippel
probability D/2²⁰ per draw (D the degree of the residual in the group's parameters): the
decision is exact arithmetic at the point, in the data and parameters fully symbolic.

The rule is applied by the same engine as the torch checker (:mod:`..engine` on SymPy matrices),
and invariance is decided interface by interface, each a polynomial identity in the data (token
rows, attention weights, activation values, RoPE cos/sin) and the parameters, whose coefficients
must vanish identically in the element's symbols:

* **attention scores** (q·R_Δ·kᵀ per query head, up to a constant per query — softmax ignores it);
* **attention output** Σ_h Σ_j a_hj·v_j·W_O[h] + b_O with the attention weights unchanged
  (Σ_j a_hj = 1), which must become the original output times the stream map S;
* **block output**: the above and everything else a block and the model's ends compute — the
  FFN (its pre-activations z must map as z·T with T monomial and act(t·u) = t·act(u) for its
  entries, checked by SymPy on the activation itself; SwiGLU's gate by permutations only), the
  MoE router (up to a constant per token), post-LN norms, the embeddings (S is *solved* from the
  embedding's map W_E ↦ W_E·S; identity when W_E is not mapped or there are no token embeddings),
  the norm core (n(x·S) = n(x)·S: ‖x·P·S‖ = ‖x·P‖ and x·S·P ∥ x·P·S, P the mean-removing
  projector for LayerNorm), and the output (logits, or the stream itself for BERT and a single
  attention layer).  Normed rows are x·P for LayerNorm, so identities that rely on the mean
  being removed are decided correctly.

When an interface fails, the checker *solves* for a correction: the rule with one parameter's
map replaced by an unknown factor (``B @ W``, ``W @ B``, ``b + t``) — or, for rotations of the
stream through an affine norm, the shared reader factor and the norm's shift — is made to vanish
identically; a unique solution is named in the rule language when it matches a candidate built
from the elements and the norm weights (``inv(transpose(M))``, ``inv(diag(norm1.w)) @ transpose(R)
@ diag(norm1.w)``, ...), and the corrected rule is re-checked from scratch.  Otherwise the checker
reports the largest tried subgroup on which the stated rule holds (e.g. M orthogonal) and a
concrete rational counterexample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...claims.rule import Rule
from ...models.config import Config
from ..budget import RESERVE, SEARCH_SHARE, Budget, BudgetSpent, unlimited
from ..engine import NotApplicable, applicability
from .corrections import correct, holds_everywhere
from .counterexamples import condition, counterexample, generic_counterexample
from .elements import element_assignments, element_size
from .interfaces import ArchResult, abbrev, run_arch
from .model import SymModel, SymView, arch_config, arch_key, arch_label, trivial_group


@dataclass
class SymbolicResult:
    verdict_holds: bool  # the stated rule is invariant on every architecture class
    per_arch: list[dict]
    corrected: Rule | None = None
    corrected_text: str | None = None
    correction_note: str = ""
    condition: str | None = None
    counterexample: str | None = None
    steps: list[str] = field(default_factory=list)
    search: list[str] = field(default_factory=list)  # why each tried correction slot gave nothing
    budget_seconds: float | None = None
    budget_cut: list[str] = field(default_factory=list)  # what the time budget stopped (empty: nothing)
    sizes: dict = field(default_factory=dict)  # the symbolic block's dimensions

    def to_json(self) -> dict:
        return {
            "holds": self.verdict_holds,
            "per_arch": self.per_arch,
            "corrected_rule": self.corrected_text,
            "correction_note": self.correction_note,
            "condition": self.condition,
            "counterexample": self.counterexample,
            "steps": self.steps,
            "correction_search": self.search,
            "budget_seconds": self.budget_seconds,
            "budget_cut": self.budget_cut,
            "sizes": self.sizes,
        }


def _arch_models(rule: Rule, cfgs: list[Config]) -> list[SymModel]:
    seen, out = set(), []
    for cfg in cfgs:
        key = arch_key(cfg, rule)
        if key in seen:
            continue
        seen.add(key)
        m = SymModel.of(cfg, rule)
        if applicability(rule, m.shape, SymView(m.cfg, m.params).has) is None:
            out.append(m)
    return out


def check(rule: Rule, cfgs: list[Config], budget: Budget | None = None) -> SymbolicResult:
    """Decide the rule on the architecture classes of ``cfgs``; solve for a correction if it fails.

    The decision on the stated rule is exact and bounded by size alone.  The searches after a
    failure (correction, condition, small counterexample) are bounded by size limits and share
    ``budget`` (default: no time limit — the audit passes :data:`~.budget.SYMBOLIC_SECONDS` per
    claim); one that runs out of time stops with what it has, and the result says so
    (``budget_cut``)."""
    budget = budget or unlimited()
    models = _arch_models(rule, cfgs)
    if not models:
        raise NotApplicable("the rule applies to none of the architecture classes at symbolic size")
    for el in rule.elements:
        n = element_size(el, models[0].shape.dims)
        if trivial_group(el, n):
            raise NotApplicable(
                f"{el.symbol} ∈ {el.text()} is the trivial group at n = {n}: the rule is the identity "
                "map and a symbolic HOLDS would be vacuous"
            )
    results = []
    for m in models:
        for els in element_assignments(rule, m.shape):
            results.append((m, run_arch(rule, m, els)))
    per = [_arch_json(r) for _, r in results]
    ok = all(r.holds for _, r in results)
    out = SymbolicResult(
        ok,
        per,
        budget_seconds=budget.seconds,
        budget_cut=budget.cut,
        sizes={k: v for k, v in models[0].shape.dims.items() if v},
    )
    lines: dict[str, int] = {}
    for _, r in results:
        line = (
            f"{r.arch}: "
            + ("invariant" if r.holds else "NOT invariant: " + "; ".join(it.name for it in r.interfaces if not it.ok))
            + f" (stream map {r.stream_map})"
        )
        lines[line] = lines.get(line, 0) + 1
    out.steps = [f"{line} — {k} exact element draw(s)" for line, k in lines.items()]
    if ok:
        return out
    failing = [(m, r) for m, r in results if not r.holds]
    failing_models = list({id(m): m for m, _ in failing}.values())
    part = budget.part(SEARCH_SHARE["correction"], RESERVE["correction"])
    try:
        corr = correct(rule, failing_models, part, out.search)
        if corr is not None:
            out.corrected, out.corrected_text, out.correction_note = corr
            # correct() verified it on the failing classes; the others must stay invariant too
            rest = [m for m in models if all(m is not f for f in failing_models)]
            ok_rest = holds_everywhere(corr[0], rest, part)
            out.steps.append(
                f"corrected rule checked at fresh exact draws on every class: "
                f"{'invariant' if ok_rest else 'NOT invariant'}"
            )
            if not ok_rest:
                out.corrected = out.corrected_text = None
                out.correction_note = "a solved correction breaks another architecture class"
    except BudgetSpent:
        out.corrected = out.corrected_text = None
        out.correction_note = ""
        budget.record(f"no correction found {part.limit_text()} (the correction search's time budget)")
    part = budget.part(SEARCH_SHARE["condition"], RESERVE["condition"])
    try:
        out.condition = condition(rule, [m for m, _ in failing], part)
    except BudgetSpent:
        budget.record(f"no condition on the group found {part.limit_text()}")
    part = budget.part(SEARCH_SHARE["counterexample"], RESERVE["counterexample"])
    try:
        out.counterexample = counterexample(rule, failing[0][0], failing[0][1], part)
    except BudgetSpent:
        out.counterexample = generic_counterexample(failing[0][1])
        budget.record(f"no small counterexample {part.limit_text()} (the generic draw is shown)")
    return out


def _arch_json(r: ArchResult) -> dict:
    return {
        "arch": r.arch,
        "invariant": r.holds,
        "stream_map": abbrev(r.stream_map, 200),
        "interfaces": [
            {
                "name": it.name,
                "quantity": it.quantity,
                "invariant": bool(it.ok),
                **({"note": it.note} if it.note else {}),
            }
            for it in r.interfaces
        ],
    }


def quantities(per_arch: list[dict]) -> dict[str, bool]:
    """The three quantities a rule claim is judged on: attention scores, attention output, block output."""
    out = {"attention scores": True, "attention output": True, "block output": True}
    for a in per_arch:
        for it in a["interfaces"]:
            if not it["invariant"]:
                out["block output"] = False
                if it["quantity"] == "scores":
                    out["attention scores"] = out["attention output"] = False
                if it["quantity"] == "attention":
                    out["attention output"] = False
    return out


__all__ = ["SymbolicResult", "arch_config", "arch_label", "check", "quantities"]
