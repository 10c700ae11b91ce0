"""The nearest true statement of a failed symmetry claim: the largest subgroup of the stated group —
among those the architecture defines, written in the rule language — on which the rule holds, as
stated or with a correction, re-checked at the second symbolic size (:func:`nearest`).

The subgroups (:data:`SUBGROUPS`) are the commutant of the rotary rotations (``rotary-GL`` and its
intersections with O, SO and the diagonal matrices: a scaled rotation in each plane, the
pass-through block of a partial rotary on its own), the stabiliser of the all-ones vector (``O1``,
``SO1``), the commutant of a generic norm weight diag(γ) (``diagonal-matrix``, ``signs``), the
stated group's own named subgroups (O, SO, positive diagonals) and permutations.  They are tried
largest first (by their continuous dimension on the architecture, then the order of the finite
ones); for each, the rule with the element restricted to it is decided at generic points of the
subgroup on every architecture class, and when it fails the correction search runs on it (the
norms following the stream, the readers' folded norm weight, one parameter's factor or
increment — a partner map, a reader or writer bias).  The first that holds at the first size is
re-checked from scratch at the second; one that holds at one size and not the other is recorded as
size-dependent and the search goes on.  Bounded by the number of subgroups and by the time budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import factorial

from ...claims.rule import Element, Rule, parse_rule
from ...errors import GaugeAuditError
from ..budget import Budget
from ..groups import rotary_layout
from .corrections import correct, holds_everywhere
from .elements import element_size
from .model import SymModel, applying, trivial_group

# every proper subgroup of a group that the rule language names (the rotary ones defined on d_k only)
SUBGROUPS = {
    "GL": (
        "rotary-GL",
        "O",
        "SO",
        "O1",
        "SO1",
        "rotary-O",
        "rotary-SO",
        "diagonal-matrix",
        "rotary-diagonal",
        "permutation",
        "signs",
    ),
    "O": ("SO", "O1", "SO1", "rotary-O", "rotary-SO", "permutation", "signs"),
    "SO": ("SO1", "rotary-SO"),
    "O1": ("SO1",),
    "rotary-GL": ("rotary-O", "rotary-SO", "rotary-diagonal"),
    "rotary-O": ("rotary-SO",),
    "diagonal-matrix": ("signs",),
    "diagonal": ("positive-diagonal",),
}


def dimension(group: str, n: int, planes: tuple = ()) -> int:
    """The continuous dimension of a group at size n (0 for a finite group)."""
    k_pl, rest = rotary_layout(n, planes)
    k, p = len(k_pl), len(rest)
    return {
        "GL": n * n,
        "O": n * (n - 1) // 2,
        "SO": n * (n - 1) // 2,
        "O1": (n - 1) * (n - 2) // 2,
        "SO1": (n - 1) * (n - 2) // 2,
        "rotary-GL": 2 * k + p * p,
        "rotary-O": k + p * (p - 1) // 2,
        "rotary-SO": k + p * (p - 1) // 2,
        "rotary-diagonal": k + p,
        "diagonal-matrix": n,
        "diagonal": n,
        "positive-diagonal": n,
        "translation": n,
        "scalar": 1,
    }.get(group, 0)


def _order(group: str, n: int) -> int:
    return {"permutation": factorial(n), "signs": 2**n}.get(group, 1)


def candidates(el: Element, n: int, planes: tuple) -> list[str]:
    """The proper subgroups of ``el``'s group to try, largest first; a rotary group only on d_k of a
    model with RoPE (without RoPE it is the unrestricted group), none that is trivial at n."""
    out = []
    for g in SUBGROUPS.get(el.group, ()):
        if g.startswith("rotary-") and (el.dim != "d_k" or not planes):
            continue
        if trivial_group(Element(el.symbol, g, el.dim), n):
            continue
        out.append(g)
    return sorted(out, key=lambda g: (-dimension(g, n, planes), -_order(g, n)))


@dataclass
class Nearest:
    """The nearest true statement found: the rule restricted to ``group`` (and corrected)."""

    symbol: str
    stated_group: str
    group: str
    rule: Rule
    corrected_maps: dict
    dimensions: list[int]  # the subgroup's continuous dimension at each symbolic size
    note: str = ""

    def statement(self) -> str:
        text = f"{self.symbol} ∈ {self.group} instead of {self.stated_group}"
        if self.corrected_maps:
            text += ", with " + "; ".join(f"{k} ↦ {v}" for k, v in self.corrected_maps.items())
        return text

    def to_json(self, sizes: list[dict]) -> dict:
        return {
            "statement": self.statement(),
            "element": self.symbol,
            "stated_group": self.stated_group,
            "group": self.group,
            "rule": self.rule.to_table(),
            "rule_text": self.rule.text(),
            "corrected_maps": self.corrected_maps,
            "checked_at_sizes": sizes,
            "dimension_at_sizes": self.dimensions,
            "note": self.note,
        }


@dataclass
class Search:
    found: Nearest | None = None
    tried: list[str] = field(default_factory=list)  # each subgroup and what it gave
    size_dependent: list[str] = field(default_factory=list)


def restricted(rule: Rule, symbol: str, group: str) -> Rule | None:
    """The rule with one element's group replaced (None if the rule language refuses it)."""
    table = rule.to_table()
    el = rule.element(symbol)
    table["elements"][symbol] = f"{group}({el.dim})"
    try:
        return parse_rule(table)
    except GaugeAuditError:
        return None


def nearest(
    rule: Rule,
    first: list[SymModel],
    second: list[SymModel],
    budget: Budget,
    allow_correction: bool,
    out: Search | None = None,
    solved: bool = False,
) -> Search:
    """The largest subgroup (see module doc) on which the rule — or, with ``allow_correction``, a
    corrected rule — holds on every class at both sizes.  A pass goes largest subgroup first: the
    rule as stated and the closed-form corrections (cheap); with ``solved`` the solved corrections,
    for the subgroups larger than what ``out`` already holds (a second pass).  ``budget`` is checked
    between decisions (BudgetSpent propagates: the caller records the cut; ``out`` keeps what was
    tried and found)."""
    out = out if out is not None else Search()
    tries = []  # (element, subgroup, restricted rule) largest first
    for el in rule.elements:
        if el.kind != "matrix" and el.group not in SUBGROUPS:
            continue
        shape = first[0].shape
        n = element_size(el, shape.dims)
        for g in candidates(el, n, shape.planes):
            sub = restricted(rule, el.symbol, g)
            if sub is not None and applying(sub, first):
                tries.append((el, g, sub))
    if solved and out.found is not None:
        keys = [(el.symbol, f"{g}({el.dim})") for el, g, _ in tries]
        tries = tries[: keys.index((out.found.symbol, out.found.group))]
    # None: the rule as stated only; False: as stated or with a closed-form correction; True: solved
    mode = solved if allow_correction else None
    stage = {None: "as stated", False: "as stated or with a closed-form correction", True: "with a solved correction"}
    for el, g, sub in tries:
        budget.check()
        label = f"{el.symbol} ∈ {g}({el.dim})"
        found, maps, note = None, {}, ""
        if mode is not True and holds_everywhere(sub, first, budget):
            found = sub
        elif mode is not None:
            corr = correct(sub, first, budget, [], slots=mode, closed=not mode)
            if corr is not None:
                found, note = corr[0], corr[2]
                maps = {m.param: m.text for m in corr[0].maps if sub.map_of(m.param) != m}
        if found is None:
            out.tried.append(f"{label}: fails {stage[mode]}")
            continue
        big = applying(found, second)
        if not big or not holds_everywhere(found, big, budget):
            out.size_dependent.append(
                f"{label}{' with ' + '; '.join(f'{k} ↦ {v}' for k, v in maps.items()) if maps else ''} holds at "
                f"the first symbolic size and not at the second: size-dependent, not reported as general"
            )
            out.tried.append(f"{label}: size-dependent")
            continue
        dims = [dimension(g, element_size(el, m.shape.dims), m.shape.planes) for m in (first[0], big[0])]
        out.found = Nearest(el.symbol, el.text(), f"{g}({el.dim})", found, maps, dims, note)
        out.tried.append(f"{label}: holds {stage[mode]}")
        return out
    return out


__all__ = ["SUBGROUPS", "Nearest", "Search", "candidates", "dimension", "nearest", "restricted"]
