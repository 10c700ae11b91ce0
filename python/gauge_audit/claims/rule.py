"""Transformation rules as data: the ``[claim.rule]`` table of a claim file.

::

    [claim.rule]
    scope = "head"                         # head | kv-group | layer | model
    elements = { s = "diagonal(d_v)" }     # symbol -> group
    [claim.rule.maps]                      # parameter -> its new value (claims.matexpr)
    W_V = "W_V @ diag(s)"
    b_V = "b_V @ diag(s)"
    W_O = "inv(diag(s)) @ W_O"

Groups (n a number or a dimension name): ``GL(n)``, ``O(n)``, ``SO(n)``, ``SO1(n)`` (the rotations
fixing the all-ones vector, ≅ SO(n−1): van Nierop's group for LayerNorm), ``diagonal(n)``
(invertible; the symbol is the 1×n row s, ``diag(s)`` the matrix), ``positive-diagonal(n)``,
``permutation(n)``, ``translation(n)`` (a 1×n row that is added) and ``scalar``; and the subgroups
an architecture defines: ``rotary-GL(d_k)``, ``rotary-O(d_k)``, ``rotary-SO(d_k)``,
``rotary-diagonal(d_k)`` (the commutant of the model's rotary rotations in GL, O, SO and the
diagonal matrices), ``O1(n)`` (orthogonal, fixing the all-ones vector), ``diagonal-matrix(n)`` and
``signs(n)`` (the commutant of a generic diag(γ) in GL and O).

Parameter names are those of :mod:`gauge_audit.models.naming` (per head, per layer, per model).
Scope: ``head`` draws one element per query head and layer, ``kv-group`` one per KV head (shared by
the query heads that read it), ``layer`` one per block, ``model`` one for the network.  All maps are
simultaneous (every right-hand side reads the original parameters).  A map of a parameter shared by
several elements (``b_O`` in a head-scoped rule) must be an increment ``b_O + e`` / ``b_O - e``; the
increments of all elements add up (``b_O - c @ W_O`` is b_O − Σ_h c_h·W_O[h]).

Everything is validated when the file is loaded — unknown parameters, functions or groups, shapes
that do not fit, an inverse of something that need not be invertible, parse errors, a parameter no
reference model has — each problem one ``FILE:LINE: field rule...`` line.  Nothing is evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import GaugeAuditError
from ..models.naming import HEAD, KV, LAYER, LEVEL_NAMES, MODEL, PARAMS
from .matexpr import (
    DIM_NAMES,
    FUNCTIONS,
    GENERIC,
    GROUP,
    NONE,
    Dim,
    Node,
    Symbol,
    dims_compatible,
    parse_expression,
    shape_text,
)

SCOPES = {"model": MODEL, "layer": LAYER, "kv-group": KV, "head": HEAD}
# group -> (value kind, invertibility of the value (a vector's: of diag(value)), description)
GROUPS = {
    "GL": ("matrix", GROUP, "every invertible n×n matrix"),
    "O": ("matrix", GROUP, "orthogonal n×n matrices"),
    "SO": ("matrix", GROUP, "rotations: orthogonal, determinant +1"),
    "SO1": ("matrix", GROUP, "rotations fixing the all-ones vector (≅ SO(n−1))"),
    "diagonal": ("vector", GROUP, "invertible diagonal matrices: the 1×n row s with s_i ≠ 0"),
    "positive-diagonal": ("vector", GROUP, "the 1×n row s with s_i > 0"),
    "permutation": ("matrix", GROUP, "permutation matrices"),
    "translation": ("vector", NONE, "a 1×n row vector that is added"),
    "scalar": ("scalar", GROUP, "a non-zero number"),
    # Subgroups an architecture defines (the nearest true statement of a failed claim is written in them).
    # The rotary groups are the commutant of the model's rotary rotations in GL / O / SO / the diagonal
    # matrices: per rotary plane a·I + b·J (a scaled rotation, GL(1,ℂ)), and on the coordinates RoPE leaves
    # alone (partial rotary; all of d_k without RoPE) the corresponding group of that block.
    "rotary-GL": ("matrix", GROUP, "d_k×d_k matrices commuting with every rotary rotation: a·I + b·J per plane"),
    "rotary-O": ("matrix", GROUP, "orthogonal matrices commuting with every rotary rotation: a rotation per plane"),
    "rotary-SO": ("matrix", GROUP, "rotations commuting with every rotary rotation (SO on the pass-through block)"),
    "rotary-diagonal": ("matrix", GROUP, "diagonal matrices commuting with every rotary rotation: one scale per plane"),
    "O1": ("matrix", GROUP, "orthogonal matrices fixing the all-ones vector (≅ O(n−1))"),
    "diagonal-matrix": ("matrix", GROUP, "invertible diagonal n×n matrices (the commutant of a generic diag(γ))"),
    "signs": ("matrix", GROUP, "diagonal matrices of ±1 (the commutant of a generic diag(γ) in O(n))"),
}
CONTINUOUS = (
    "GL",
    "O",
    "SO",
    "SO1",
    "diagonal",
    "positive-diagonal",
    "translation",
    "scalar",
    "rotary-GL",
    "rotary-O",
    "rotary-SO",
    "rotary-diagonal",
    "O1",
    "diagonal-matrix",
)
ROTARY = ("rotary-GL", "rotary-O", "rotary-SO", "rotary-diagonal")  # defined on d_k only
RULE_KEYS = ("scope", "elements", "maps")
_GROUP_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*\(\s*([A-Za-z_][A-Za-z_0-9]*|[0-9]+)\s*\)\s*$")
_SYMBOL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Element:
    symbol: str
    group: str
    dim: Dim | None  # None for scalar

    @property
    def kind(self) -> str:
        return GROUPS[self.group][0]

    @property
    def shape(self) -> tuple:
        if self.kind == "scalar":
            return (1, 1)
        return (self.dim, self.dim) if self.kind == "matrix" else (1, self.dim)

    @property
    def continuous(self) -> bool:
        return self.group in CONTINUOUS

    def text(self) -> str:
        return "scalar" if self.group == "scalar" else f"{self.group}({self.dim})"


@dataclass(frozen=True)
class Map:
    param: str
    node: Node
    increment: Node | None  # the e of ``P + e`` (``P - e`` is stored as −e) when the map has that form
    context_level: int  # the finest level among the parameter, its references and (if used) the scope

    @property
    def text(self) -> str:
        return self.node.text()

    @property
    def elements_used(self) -> set[str]:
        return {n for n in self.node.names() if n not in PARAMS}


@dataclass(frozen=True)
class Rule:
    scope: str
    elements: tuple[Element, ...]
    maps: tuple[Map, ...]

    @property
    def scope_level(self) -> int:
        return SCOPES[self.scope]

    def element(self, symbol: str) -> Element:
        return next(e for e in self.elements if e.symbol == symbol)

    def map_of(self, param: str) -> Map | None:
        return next((m for m in self.maps if m.param == param), None)

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(m.param for m in self.maps)

    @property
    def referenced(self) -> set[str]:
        """Every parameter the rule reads or writes."""
        out = set(self.params)
        for m in self.maps:
            out |= {n for n in m.node.names() if n in PARAMS}
        return out

    def to_table(self) -> dict:
        """The rule as the TOML table it came from (canonical expressions)."""
        return {
            "scope": self.scope,
            "elements": {e.symbol: e.text() for e in self.elements},
            "maps": {m.param: m.text for m in self.maps},
        }

    def text(self) -> str:
        els = ", ".join(f"{e.symbol} ∈ {e.text()}" for e in self.elements)
        return f"per {self.scope}, {els}: " + "; ".join(f"{m.param} ↦ {m.text}" for m in self.maps)

    def with_maps(self, changes: dict[str, str]) -> Rule:
        """A new rule with some maps replaced (or added) — e.g. a derived correction."""
        table = self.to_table()
        table["maps"] = {**table["maps"], **changes}
        return parse_rule(table)


# ------------------------------------------------------------------------------------------ validation
def _flatten_maps(maps: dict) -> list[tuple[str, object]]:
    """``{norm1 = {w = "..."}}`` (a TOML dotted key) is the same as ``{"norm1.w" = "..."}``."""
    out = []
    for k, v in maps.items():
        if isinstance(v, dict):
            out += [(f"{k}.{kk}", vv) for kk, vv in _flatten_maps(v)]
        else:
            out.append((k, v))
    return out


def _vanishes_at_zero(node: Node, name: str) -> bool:
    """Is the expression 0 whenever the parameter ``name`` is 0 (every term carries it as a factor)?"""
    op = node.op
    if op == "name":
        return node.name == name
    if op == "num":
        return node.value == 0
    if op in ("add", "sub"):
        return all(_vanishes_at_zero(a, name) for a in node.args)
    if op in ("matmul", "mul", "outer"):
        return any(_vanishes_at_zero(a, name) for a in node.args)
    if op in ("neg", "transpose", "diag"):
        return _vanishes_at_zero(node.args[0], name)
    return False


def vanishes_at_zero(m: Map) -> bool:
    return _vanishes_at_zero(m.node, m.param)


def _increment(node: Node, param: str) -> Node | None:
    if (
        node.op in ("add", "sub")
        and node.args[0].op == "name"
        and node.args[0].name == param
        and param not in node.args[1].names()
    ):
        inc = node.args[1]
        return inc if node.op == "add" else Node("neg", inc.shape, inc.inv, (inc,), pos=inc.pos)
    return None


def symbols_for(elements: Iterable[Element]) -> dict[str, Symbol]:
    syms = {name: Symbol(p.shape, GENERIC, "param") for name, p in PARAMS.items()}
    for e in elements:
        syms[e.symbol] = Symbol(
            e.shape, GROUPS[e.group][1], "element", f"{e.symbol} ∈ {e.text()} ({GROUPS[e.group][2]})"
        )
    return syms


def _parse_group(text) -> tuple[str, Dim | None] | str:
    """(group, dim) or an error message."""
    if not isinstance(text, str):
        return 'expected a string such as "GL(d_k)"'
    if text.strip() == "scalar":
        return ("scalar", None)
    m = _GROUP_RE.match(text)
    if not m:
        return f'{text!r} is not GROUP(n) (e.g. "GL(d_k)", "diagonal(d_v)") or "scalar"'
    group, dim = m.group(1), m.group(2)
    if group not in GROUPS or group == "scalar":
        return f"unknown group {group!r} (choose from {', '.join(g for g in GROUPS)})"
    if group in ROTARY and dim != "d_k":
        return f"{group}({dim}): the rotary groups act on a head's query/key coordinates, d_k"
    if dim.isdigit():
        if not 1 <= int(dim) <= 100000:
            return f"dimension {dim} out of range"
        return (group, int(dim))
    if dim not in DIM_NAMES:
        return f"unknown dimension {dim!r} (a positive integer or one of {', '.join(DIM_NAMES)})"
    return (group, dim)


def validate_rule(
    raw, line: Callable[..., int], fail: Callable[[int, str], None], available: frozenset[str] | None = None
) -> Rule | None:
    """Check one rule table; every problem goes to ``fail(line, message)``.  ``line(*path)`` finds
    the line of ``rule``, ``rule.scope``, ``rule.elements.s``, ``rule.maps.W_V``, ...  ``available``:
    the parameter names some reference model has (None: do not check)."""
    if not isinstance(raw, dict):
        fail(line(), "field rule: expected a table ([claim.rule])")
        return None
    before = [0]

    def bad(ln: int, msg: str):
        before[0] += 1
        fail(ln, msg)

    for key in raw:
        if key not in RULE_KEYS:
            bad(line(key), f"field rule.{key}: unknown key (expected {', '.join(RULE_KEYS)})")
    scope = raw.get("scope")
    if scope is None:
        bad(line(), "field rule.scope: missing (head, kv-group, layer or model)")
    elif not isinstance(scope, str) or scope not in SCOPES:
        bad(line("scope"), f"field rule.scope: {scope!r} is not one of {', '.join(SCOPES)}")
    elements: list[Element] = []
    raw_el = raw.get("elements")
    if raw_el is None:
        bad(line(), 'field rule.elements: missing (e.g. elements = { M = "GL(d_k)" })')
    elif not isinstance(raw_el, dict) or not raw_el:
        bad(line("elements"), 'field rule.elements: expected a non-empty table symbol = "GROUP(n)"')
    else:
        for sym, text in raw_el.items():
            where = line("elements", sym)
            if isinstance(text, dict) or not _SYMBOL_RE.match(sym):
                bad(where, f"field rule.elements.{sym}: the symbol must be a plain name (letters, digits, _)")
                continue
            if sym in PARAMS or sym in FUNCTIONS or sym in DIM_NAMES:
                bad(where, f"field rule.elements.{sym}: {sym!r} is a parameter, function or dimension name")
                continue
            g = _parse_group(text)
            if isinstance(g, str):
                bad(where, f"field rule.elements.{sym}: {g}")
                continue
            elements.append(Element(sym, g[0], g[1]))
    maps: list[Map] = []
    raw_maps = raw.get("maps")
    if raw_maps is None:
        bad(line(), 'field rule.maps: missing (parameter = "expression")')
    elif not isinstance(raw_maps, dict) or not raw_maps:
        bad(line("maps"), 'field rule.maps: expected a non-empty table parameter = "expression"')
    else:
        symbols = symbols_for(elements)
        scope_level = SCOPES.get(scope, MODEL) if isinstance(scope, str) else MODEL
        map_errors = before[0]
        for param, text in _flatten_maps(raw_maps):
            where = line("maps", param)
            label = f"field rule.maps.{param}"
            if param not in PARAMS:
                bad(where, f"{label}: unknown parameter {param!r} (known: {', '.join(PARAMS)})")
                continue
            if not isinstance(text, str):
                bad(where, f"{label}: expected an expression string")
                continue
            try:
                node = parse_expression(text, symbols)
            except GaugeAuditError as exc:
                bad(where, f"{label}: {exc}")
                continue
            want = PARAMS[param].shape
            if not all(dims_compatible(a, b) for a, b in zip(node.shape, want)):
                bad(where, f"{label}: the expression is {shape_text(node.shape)} but {param} is {shape_text(want)}")
                continue
            refs = [n for n in node.names() if n in PARAMS]
            if available is not None:
                missing = [n for n in sorted({param, *refs}) if n not in available]
                if missing:
                    bad(
                        where,
                        f"{label}: no reference model has {', '.join(missing)} "
                        f"({'; '.join(PARAMS[n].doc for n in missing)})",
                    )
                    continue
            uses_element = any(n not in PARAMS for n in node.names())
            level = max(
                [PARAMS[param].level] + [PARAMS[n].level for n in refs] + ([scope_level] if uses_element else [])
            )
            maps.append(Map(param, node, _increment(node, param), level))
        used = set().union(*(m.elements_used for m in maps)) if maps else set()
        clean = before[0] == map_errors  # an unparsable map may be the one that uses the element
        for e in elements:
            if maps and clean and e.symbol not in used:
                bad(line("elements", e.symbol), f"field rule.elements.{e.symbol}: declared but used in no map")
    if before[0]:
        return None
    assert isinstance(scope, str)  # no problem reported: the scope was checked to be one of SCOPES
    return Rule(scope, tuple(elements), tuple(maps))


def parse_rule(table, where: str = "rule") -> Rule:
    """A rule from a dict of the TOML table's shape (the testing API, derived corrections);
    every problem in one :class:`GaugeAuditError` (``where: field ...`` per line)."""
    problems: list[str] = []
    rule = validate_rule(table, lambda *path: 0, lambda ln, msg: problems.append(f"{where}: {msg}"))
    if problems:
        raise GaugeAuditError(*problems)
    assert rule is not None  # validate_rule returns None only after reporting a problem
    return rule


def level_name(level: int) -> str:
    return LEVEL_NAMES[level]


__all__ = [
    "CONTINUOUS",
    "Element",
    "GROUPS",
    "Map",
    "ROTARY",
    "Rule",
    "SCOPES",
    "level_name",
    "parse_rule",
    "symbols_for",
    "validate_rule",
    "vanishes_at_zero",
]
