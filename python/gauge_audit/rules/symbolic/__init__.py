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
from ..engine import NotApplicable
from .corrections import correct, holds_everywhere
from .counterexamples import condition, counterexample, generic_counterexample
from .elements import element_assignments, element_size
from .interfaces import ArchResult, abbrev, run_arch
from .model import SymModel, applying, arch_config, arch_key, arch_label, trivial_group
from .nearest import Nearest, Search, nearest


@dataclass
class SymbolicResult:
    verdict_holds: bool  # the stated rule is invariant on every architecture class, at both sizes
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
    sizes: dict = field(default_factory=dict)  # the symbolic block's dimensions (first size)
    sizes_second: dict = field(default_factory=dict)  # ... at the second, larger size
    nearest: Nearest | None = None  # the nearest true statement when the stated group fails
    nearest_search: list[str] = field(default_factory=list)  # each subgroup tried and what it gave
    size_dependent: list[str] = field(default_factory=list)  # statements true at one size only

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
            "sizes_second": self.sizes_second,
            "nearest": self.nearest.to_json([self.sizes, self.sizes_second]) if self.nearest else None,
            "nearest_search": self.nearest_search,
            "size_dependent": self.size_dependent,
        }


def _arch_models(rule: Rule, cfgs: list[Config], size: int = 0) -> list[SymModel]:
    seen, out = set(), []
    for cfg in cfgs:
        key = arch_key(cfg, rule)
        if key in seen:
            continue
        seen.add(key)
        out.append(SymModel.of(cfg, rule, size))
    return applying(rule, out)


def _decide_all(rule: Rule, models: list[SymModel]) -> list[tuple[SymModel, ArchResult]]:
    return [(m, run_arch(rule, m, els)) for m in models for els in element_assignments(rule, m.shape)]


def _step_lines(results, tag: str = "") -> list[str]:
    lines: dict[str, int] = {}
    for _, r in results:
        line = (
            f"{r.arch}{tag}: "
            + ("invariant" if r.holds else "NOT invariant: " + "; ".join(it.name for it in r.interfaces if not it.ok))
            + f" (stream map {r.stream_map})"
        )
        lines[line] = lines.get(line, 0) + 1
    return [f"{line} — {k} exact element draw(s)" for line, k in lines.items()]


def _size_text(models: list[SymModel]) -> str:
    d = models[0].shape.dims
    return ", ".join(f"{k} {d[k]}" for k in ("d_model", "d_k", "d_ff") if d.get(k))


def check(rule: Rule, cfgs: list[Config], budget: Budget | None = None, nearest_search: bool = True) -> SymbolicResult:
    """Decide the rule on the architecture classes of ``cfgs`` at two symbolic sizes; solve for a
    correction if it fails, else (``nearest_search``) for the nearest true statement.

    The decision on the stated rule is exact and bounded by size alone.  The searches after a
    failure (correction, nearest statement, condition, small counterexample) are bounded by size
    limits and share ``budget`` (default: no time limit — the audit passes
    :data:`~.budget.SYMBOLIC_SECONDS` per claim); one that runs out of time stops with what it has,
    and the result says so (``budget_cut``).  Whatever is reported — a HOLDS, a correction, a
    subgroup, a condition — holds at both sizes; a statement true at one size only is listed as
    size-dependent."""
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
    second = _arch_models(rule, cfgs, size=1)
    results = _decide_all(rule, models)
    ok = all(r.holds for _, r in results)
    out = SymbolicResult(
        ok,
        [],
        budget_seconds=budget.seconds,
        budget_cut=budget.cut,
        sizes={k: v for k, v in models[0].shape.dims.items() if v},
        sizes_second={k: v for k, v in second[0].shape.dims.items() if v} if second else {},
    )
    out.steps = _step_lines(results)
    if ok and second:
        big = _decide_all(rule, second)
        out.steps += _step_lines(big, f" (second size: {_size_text(second)})")
        if not all(r.holds for _, r in big):
            ok = out.verdict_holds = False
            out.size_dependent.append(
                f"the stated rule holds at the first symbolic size ({_size_text(models)}) and not at the second "
                f"({_size_text(second)}): size-dependent, so not a symmetry"
            )
            models, results = second, big
        results = results if not ok else results + big
    out.per_arch = [_arch_json(r) for _, r in results]
    if ok:
        return out
    failing = [(m, r) for m, r in results if not r.holds]
    failing_models = list({id(m): m for m, _ in failing}.values())
    # cheap before expensive: the closed-form corrections in the stated group, the subgroups as stated
    # or with a closed-form correction, then the solved corrections in the stated group (a correction
    # in the stated group beats any subgroup), then the solved corrections on larger subgroups
    found = Search()
    part = budget.part(SEARCH_SHARE["correction"], RESERVE["correction"])
    for stage in ("closed", "nearest", "slots", "nearest-solved"):
        if out.corrected is not None or part.spent():
            break
        try:
            if stage.startswith("nearest"):
                if nearest_search:
                    nearest(rule, models, second or models, part, True, found, solved=stage == "nearest-solved")
                continue
            corr = correct(rule, failing_models, part, out.search, slots=stage == "slots", closed=stage == "closed")
            if corr is not None:
                _keep_correction(out, corr, models, second, failing_models, part)
        except BudgetSpent:
            break
    if part.spent() and out.corrected is None:
        budget.record(f"no correction found {part.limit_text()} (the searches' time budget)")
        if nearest_search and found.found is None:
            budget.record(f"no nearest true statement found {part.limit_text()} (the searches' time budget)")
    if out.corrected is None:
        out.nearest = found.found
    out.nearest_search = found.tried
    out.size_dependent += found.size_dependent
    if out.nearest is not None:
        out.steps.append(f"nearest true statement: {out.nearest.statement()} — checked at both sizes")
    if out.nearest is not None and not out.nearest.corrected_maps:
        out.condition = f"holds only for {out.nearest.symbol} ∈ {out.nearest.group}, not for a generic element of {out.nearest.stated_group}"
    elif out.nearest is None:
        part = budget.part(SEARCH_SHARE["condition"], RESERVE["condition"])
        try:
            out.condition, dependent = condition(rule, [m for m, _ in failing], part, second or None)
            out.size_dependent += dependent
        except BudgetSpent:
            budget.record(f"no condition on the group found {part.limit_text()}")
    part = budget.part(SEARCH_SHARE["counterexample"], RESERVE["counterexample"])
    try:
        out.counterexample = counterexample(rule, failing[0][0], failing[0][1], part)
    except BudgetSpent:
        out.counterexample = generic_counterexample(failing[0][1])
        budget.record(f"no small counterexample {part.limit_text()} (the generic draw is shown)")
    return out


def _keep_correction(out: SymbolicResult, corr, models, second, failing_models, part: Budget) -> None:
    """Keep a solved correction if it also holds on the classes that did not fail and at the second
    size (correct() verified it on the failing classes); else record why not."""
    try:
        rest = [m for m in models if all(m is not f for f in failing_models)]
        ok_rest = holds_everywhere(corr[0], rest, part)
        out.steps.append(
            f"corrected rule checked at fresh exact draws on every class: {'invariant' if ok_rest else 'NOT invariant'}"
        )
        if not ok_rest:
            out.correction_note = "a solved correction breaks another architecture class"
            return
        if second and models is not second:
            ok_big = holds_everywhere(corr[0], applying(corr[0], second), part)
            out.steps.append(
                f"corrected rule at the second size ({_size_text(second)}): {'invariant' if ok_big else 'NOT invariant'}"
            )
            if not ok_big:
                out.size_dependent.append(
                    f"the correction {corr[1]} holds at the first symbolic size and not at the second: "
                    "size-dependent, not reported"
                )
                return
    except BudgetSpent:
        out.budget_cut.append(f"the correction {corr[1]} was not re-checked {part.limit_text()}: not reported")
        return
    out.corrected, out.corrected_text, out.correction_note = corr


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


__all__ = ["Nearest", "SymbolicResult", "arch_config", "arch_label", "check", "quantities"]
