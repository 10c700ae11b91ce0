"""The claim catalog: TOML data files in ``claims/`` and their validating loader.

Schema (one file per source document; see README "Claim catalog")::

    [document]
    key = "van-nierop"                       # short name, optional (defaults to the file stem)
    title = "Transformer models are gauge invariant"
    authors = ["Leo van Nierop"]
    reference = "arXiv:2412.14543"
    note = "..."                             # optional

    [[claim]]
    id = "value-g3-eq-g0"                    # stable, lowercase, [a-z0-9-]
    source = "paper"                         # optional; who asserts it (default: the document title)
    location = "Sec. 4.4, eq. (10)"
    statement = "From the value matrix, g(3) = g(0)."
    kind = "derivation"                      # symmetry | derivation | count | accuracy | bound
    checkers = ["symbolic", "lean"]          # subset of symbolic, precision, torch, nullity, lean
    params = { d_e = 3 }                     # small ints / floats / strings / bools, lists, tables
    formula = "..."                          # optional, restricted formula language (claims.expr)
    claimed_value = 1100000                  # optional number
    claimed_percent = [1.3, 0.7, 0.3]        # optional number or list of numbers
    relation = ">="                          # optional: "=", ">=", "<=", "~" (default "=")
    action = "qk-gl"                         # optional: name of the numeric gauge action
    expected = "holds"                       # optional: what the source asserts the action does
    corrected_action = "stream-rotation"     # optional: the action implementing the corrected rule
    models = ["gpt2-tiny", "minilm"]         # optional: reference models for the torch check
    note = "..."                             # optional free text
    [claim.rule]                             # optional: the transformation itself, as data (claims.rule)
    scope = "head"
    elements = { s = "diagonal(d_v)" }
    maps = { W_V = "W_V @ diag(s)", W_O = "inv(diag(s)) @ W_O" }

Every problem (TOML syntax, unknown key, missing field, wrong type, duplicate id) is
reported as a line ``FILE:LINE: field NAME: ...``; all problems of a file (of every
file, for :func:`load_catalog`) come together in one :class:`GaugeAuditError`.  Claim text is data: formulas go through :mod:`gauge_audit.claims.expr`,
nothing is evaluated as code.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..actions import ACTIONS
from ..errors import GaugeAuditError
from ..models import model_names
from ..models.naming import PARAMS as RULE_PARAMS
from ..models.naming import present
from .expr import parse_formula
from .rule import Rule, validate_rule

ROOT = Path(__file__).resolve().parents[3]
CATALOG_DIR = ROOT / "claims"

KINDS = ("symmetry", "derivation", "count", "accuracy", "bound")
CHECKERS = ("symbolic", "precision", "torch", "nullity", "lean")
RELATIONS = ("=", ">=", "<=", "~")
EXPECTED = ("holds", "fails")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")

DOCUMENT_FIELDS = {
    "key": (str, False),
    "title": (str, True),
    "authors": (list, True),
    "reference": (str, True),
    "note": (str, False),
}
CLAIM_FIELDS = {
    "id": (str, True),
    "source": (str, False),
    "location": (str, True),
    "statement": (str, True),
    "kind": (str, True),
    "checkers": (list, True),
    "params": (dict, False),
    "formula": (str, False),
    "claimed_value": ((int, float), False),
    "claimed_percent": ((int, float, list), False),
    "relation": (str, False),
    "action": (str, False),
    "expected": (str, False),
    "corrected_action": (str, False),
    "models": (list, False),
    "note": (str, False),
    "rule": (dict, False),
}


@dataclass(frozen=True)
class Document:
    key: str
    title: str
    authors: tuple[str, ...]
    reference: str
    file: str
    note: str | None = None


@dataclass(frozen=True)
class Claim:
    id: str
    document: Document
    source: str
    location: str
    statement: str
    kind: str
    checkers: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    formula: str | None = None
    claimed_value: int | float | None = None
    claimed_percent: tuple[float, ...] | None = None
    relation: str = "="
    action: str | None = None
    expected: str = "holds"
    corrected_action: str | None = None
    models: tuple[str, ...] | None = None
    note: str | None = None
    rule: Rule | None = None
    file: str = ""
    line: int = 0

    @property
    def where(self) -> str:
        """``document — location``: the citation shown in listings and proofs.md."""
        return (
            f"{self.document.title} ({self.source}), {self.location}"
            if self.source != self.document.title
            else f"{self.document.title}, {self.location}"
        )

    @property
    def formula_expr(self):
        """The claim's formula as a SymPy expression (None when there is none)."""
        if self.formula is None:
            return None
        return parse_formula(self.formula)

    @property
    def function_name(self) -> str:
        return self.id.replace("-", "_")


# ------------------------------------------------------------------------------------------
# line lookup (tomllib has no positions)


def _claim_blocks(text: str) -> list[tuple[int, int]]:
    """(first line, last line) of every ``[[claim]]`` block, 1-based, in file order.

    A block runs from its ``[[claim]]`` header to the line before the next table header
    that is not one of its own sub-tables (``[claim.params]``)."""
    lines = text.splitlines()
    header = re.compile(r"^\s*\[")
    own = re.compile(r"^\s*\[\[?\s*claim\.")
    blocks = []
    for i, ln in enumerate(lines):
        if re.match(r"^\s*\[\[\s*claim\s*\]\]", ln):
            end = len(lines)
            for j in range(i + 1, len(lines)):
                if header.match(lines[j]) and not own.match(lines[j]):
                    end = j
                    break
            blocks.append((i + 1, end))
    return blocks


def _key_line(text: str, block: tuple[int, int], key: str) -> int:
    lines = text.splitlines()
    pat = re.compile(rf"^\s*{re.escape(key)}\s*[=.]|^\s*\[\s*claim\.{re.escape(key)}\s*\]")
    for i in range(block[0] - 1, block[1]):
        if pat.match(lines[i]):
            return i + 1
    return block[0]


def _rule_line(text: str, block: tuple[int, int], *path: str) -> int:
    """The line of ``rule`` (its ``[claim.rule]`` header), ``rule.KEY`` or ``rule.TABLE.KEY`` in a
    claim block, whichever TOML spelling is used (sub-table header, inline table, dotted or quoted
    key); the nearest enclosing line when the exact one is not found."""
    lines = text.splitlines()
    lo, hi = block[0] - 1, block[1]

    def find(pattern: str, start: int) -> int | None:
        pat = re.compile(pattern)
        return next((i for i in range(start, hi) if pat.search(lines[i])), None)

    head = find(r"^\s*\[\s*claim\.rule\s*\]|^\s*rule\s*[=.]", lo)
    start = head if head is not None else lo
    if not path:
        return start + 1
    sub = find(rf"^\s*\[\s*claim\.rule\.{re.escape(path[0])}\s*\]|(^|[\s{{,.])\"?{re.escape(path[0])}\"?\s*[=.]", start)
    if sub is None:
        return start + 1
    if len(path) == 1:
        return sub + 1
    # a dotted parameter (norm1.w) may be quoted, dotted or nested (norm1 = { w = ... })
    key = re.escape(path[1]).replace(r"\.", r"\"?\s*\.\s*\"?")
    hit = find(rf"(^|[\s{{,]){chr(34)}?{key}{chr(34)}?\s*=", sub)
    return (hit if hit is not None else sub) + 1


@lru_cache(maxsize=1)
def available_rule_params() -> frozenset[str]:
    """Rule parameter names that at least one reference model has (a rule touching any other
    is refused when its file is loaded)."""
    from ..models import NAMED, param_shapes

    out = set()
    for cfg in NAMED.values():
        keys = param_shapes(cfg)
        out |= {name for name in RULE_PARAMS if present(cfg, name, keys)}
    return frozenset(out)


def _section_line(text: str, name: str, key: str | None = None) -> int:
    lines = text.splitlines()
    start = None
    for i, ln in enumerate(lines):
        if re.match(rf"^\s*\[\s*{name}\s*\]", ln):
            start = i
            break
    if start is None:
        return 1
    if key is None:
        return start + 1
    for i in range(start + 1, len(lines)):
        if re.match(r"^\s*\[", lines[i]):
            break
        if re.match(rf"^\s*{re.escape(key)}\s*=", lines[i]):
            return i + 1
    return start + 1


# ------------------------------------------------------------------------------------------
# validation


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return " or ".join(_type_name(x) for x in t)
    return {str: "string", list: "array", dict: "table", int: "integer", float: "number"}.get(t, t.__name__)


def _check_type(value, expected) -> bool:
    types = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _check_param_value(value, depth=0) -> bool:
    if depth > 4:
        return False
    if isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return all(_check_param_value(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _check_param_value(v, depth + 1) for k, v in value.items())
    return False  # dates/times are not parameters


def _freeze(value):
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def load_file(path: Path | str) -> tuple[Document, list[Claim]]:
    path = Path(path)
    try:
        shown = str(path.relative_to(ROOT))
    except ValueError:
        shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GaugeAuditError(f"{shown}:0: cannot read claim file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise GaugeAuditError(f"{shown}:0: claim file is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return load_text(text, shown)


class _Problems:
    """Collects every ``FILE:LINE: message`` of one file, so a user fixes them all in one pass."""

    def __init__(self, shown: str):
        self.shown = shown
        self.items: list = []

    def __call__(self, line: int, msg: str) -> None:
        self.items.append((int(line), f"{self.shown}:{line}: {msg}"))

    def raise_if_any(self) -> None:
        if self.items:
            lines = [m for _, m in sorted(self.items, key=lambda x: x[0])]  # stable: file order
            raise GaugeAuditError(*lines)


def _validate_document(text: str, doc, fail: _Problems) -> bool:
    """Check the [document] table; True when it is usable for building a Document."""
    if not isinstance(doc, dict):
        fail(1, "field document: missing [document] table")
        return False
    ok = True
    for key in doc:
        if key not in DOCUMENT_FIELDS:
            fail(_section_line(text, "document", key), f"field document.{key}: unknown key")
    for key, (typ, required) in DOCUMENT_FIELDS.items():
        if key not in doc:
            if required:
                fail(_section_line(text, "document"), f"field document.{key}: missing")
                ok = False
            continue
        if not _check_type(doc[key], typ):
            fail(_section_line(text, "document", key), f"field document.{key}: expected {_type_name(typ)}")
            ok = False
        elif key == "authors" and (not doc[key] or not all(isinstance(a, str) for a in doc[key])):
            fail(
                _section_line(text, "document", "authors"),
                "field document.authors: expected a non-empty array of strings",
            )
            ok = False
    return ok


def _validate_claim(raw: dict, n: int, line_of, block_start: int, fail: _Problems, rule_line=None) -> dict | None:
    """Check one ``[[claim]]`` table, reporting every problem; the normalised fields, or None."""
    before = len(fail.items)
    label = raw.get("id", "#" + str(n + 1))
    for key in raw:
        if key not in CLAIM_FIELDS:
            fail(line_of(key), f"field {key}: unknown key in claim {label!r}")
    typed = set()
    for key, (typ, required) in CLAIM_FIELDS.items():
        if key not in raw:
            if required:
                fail(block_start, f"field {key}: missing in claim {label!r}")
            continue
        if not _check_type(raw[key], typ):
            fail(line_of(key), f"field {key}: expected {_type_name(typ)}")
        else:
            typed.add(key)
    # Each semantic check runs only on a field that has the right type, so one problem is
    # reported once and never hides another.
    if "id" in typed and not ID_RE.match(raw["id"]):
        fail(line_of("id"), f"field id: {raw['id']!r} is not a valid id (lowercase letters, digits, '-')")
    for key in ("statement", "location"):
        if key in typed and not raw[key].strip():
            fail(line_of(key), f"field {key}: empty")
    if "kind" in typed and raw["kind"] not in KINDS:
        fail(line_of("kind"), f"field kind: {raw['kind']!r} is not one of {', '.join(KINDS)}")
    if "checkers" in typed:
        checkers = raw["checkers"]
        if not all(isinstance(c, str) for c in checkers):
            fail(line_of("checkers"), "field checkers: expected an array of strings")
        else:
            for c in checkers:
                if c not in CHECKERS:
                    fail(
                        line_of("checkers"),
                        f"field checkers: unknown checker {c!r} (choose from {', '.join(CHECKERS)})",
                    )
            if len(set(checkers)) != len(checkers):
                fail(line_of("checkers"), "field checkers: duplicate entry")
    if "params" in typed:
        for k, v in raw["params"].items():
            if not _check_param_value(v):
                fail(line_of("params"), f"field params.{k}: expected numbers, strings, booleans, arrays or tables")
    if "relation" in typed and raw["relation"] not in RELATIONS:
        fail(line_of("relation"), f"field relation: {raw['relation']!r} is not one of {', '.join(RELATIONS)}")
    if "expected" in typed and raw["expected"] not in EXPECTED:
        fail(line_of("expected"), f"field expected: {raw['expected']!r} is not one of {', '.join(EXPECTED)}")
    for key in ("action", "corrected_action"):
        if key in typed and raw[key] not in ACTIONS:
            fail(line_of(key), f"field {key}: unknown action {raw[key]!r} (see `gauge-audit check --list`)")
    models = None
    if "models" in typed:
        known = model_names()
        if not raw["models"] or not all(isinstance(m, str) and m in known for m in raw["models"]):
            fail(line_of("models"), f"field models: expected a non-empty array of model names from {', '.join(known)}")
        models = tuple(raw["models"])
    percent = None
    if "claimed_percent" in typed:
        percent = raw["claimed_percent"]
        if isinstance(percent, list):
            if not percent or not all(_check_type(p, (int, float)) for p in percent):
                fail(line_of("claimed_percent"), "field claimed_percent: expected a number or array of numbers")
            else:
                percent = tuple(float(p) for p in percent)
        else:
            percent = (float(percent),)
    if "formula" in typed:
        try:
            parse_formula(raw["formula"])
        except GaugeAuditError as exc:
            fail(line_of("formula"), f"field formula: {exc}")
    rule = None
    if "rule" in typed:
        for key in ("action", "corrected_action"):
            if key in raw:
                fail(line_of(key), f"field {key}: a claim with a [claim.rule] names no action (the rule is the action)")
        rule = validate_rule(raw["rule"], rule_line or (lambda *path: line_of("rule")), fail, available_rule_params())
    if len(fail.items) > before:
        return None
    return dict(models=models, percent=percent, rule=rule)


UNCHECKED_FIELDS = ("quote", "location", "reason")


@dataclass(frozen=True)
class Unchecked:
    """A statement of a source read but not checkable (an analogy, advice, a vague "may", an undefined
    object): kept in the catalog with the reason, so nothing read is dropped silently."""

    document: Document
    quote: str
    location: str
    reason: str


def _validate_unchecked(rows, text: str, fail: _Problems) -> None:
    if not isinstance(rows, list):
        fail(_section_line(text, "unchecked"), "field unchecked: use [[unchecked]] array-of-tables")
        return
    heads = [i + 1 for i, ln in enumerate(text.splitlines()) if re.match(r"^\s*\[\[\s*unchecked\s*\]\]", ln)]
    for n, row in enumerate(rows):
        line = heads[n] if n < len(heads) else 1
        if not isinstance(row, dict):
            fail(line, f"field unchecked: entry #{n + 1} is not a table")
            continue
        for key in row:
            if key not in UNCHECKED_FIELDS:
                fail(line, f"field unchecked.{key}: unknown key")
        for key in UNCHECKED_FIELDS:
            if not isinstance(row.get(key), str) or not row[key].strip():
                fail(line, f"field unchecked.{key}: missing or not a non-empty string")


def load_unchecked(paths: Iterable[Path | str] | None = None) -> list[Unchecked]:
    """Every ``[[unchecked]]`` row of the catalog files, in file order (files validated as by load_catalog)."""
    files = catalog_files() if paths is None else [Path(p) for p in paths]
    out = []
    for path in files:
        document, _ = load_file(path)
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        out += [
            Unchecked(document, " ".join(r["quote"].split()), r["location"], " ".join(r["reason"].split()))
            for r in data.get("unchecked", [])
        ]
    return out


def load_text(text: str, shown: str = "<claims>") -> tuple[Document, list[Claim]]:
    """Validate the TOML ``text`` of one claim file; ``shown`` names it in error messages.

    Every field problem of the file is reported in one :class:`GaugeAuditError` (one
    ``FILE:LINE: field ...`` line each, in file order); a TOML syntax error stops at the
    first, since the parser cannot go on."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        line = m.group(1) if m else str(max(1, len(text.splitlines())) if "end of document" in str(exc) else 1)
        raise GaugeAuditError(f"{shown}:{line}: TOML syntax error: {exc}") from None

    fail = _Problems(shown)
    for key in data:
        if key not in ("document", "claim", "unchecked"):
            fail(
                _section_line(text, key)
                if isinstance(data[key], dict)
                else _key_line(text, (1, len(text.splitlines())), key),
                f"unknown top-level key {key!r} (expected [document], [[claim]] and [[unchecked]])",
            )
    _validate_unchecked(data.get("unchecked", []), text, fail)
    doc = data.get("document")
    document = None
    if _validate_document(text, doc, fail):
        assert doc is not None  # _validate_document accepts only a table
        document = Document(
            key=doc.get("key", Path(shown).stem),
            title=doc["title"],
            authors=tuple(doc["authors"]),
            reference=doc["reference"],
            file=shown,
            note=doc.get("note"),
        )

    raw_claims = data.get("claim", [])
    if not isinstance(raw_claims, list):
        fail(_section_line(text, "claim"), "field claim: use [[claim]] array-of-tables")
        raw_claims = []
    blocks = _claim_blocks(text)
    claims: list[Claim] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(raw_claims):
        block = blocks[n] if n < len(blocks) else (1, len(text.splitlines()))
        line_of = lambda key, block=block: _key_line(text, block, key)  # noqa: E731
        if not isinstance(raw, dict):
            fail(block[0], f"field claim: entry #{n + 1} is not a table (use [[claim]])")
            continue
        rule_line = lambda *path, block=block: _rule_line(text, block, *path)  # noqa: E731
        norm = _validate_claim(raw, n, line_of, block[0], fail, rule_line)
        cid = raw.get("id")
        if isinstance(cid, str):
            if cid in seen:
                fail(line_of("id"), f"field id: duplicate id {cid!r} (also at line {seen[cid]})")
            else:
                seen[cid] = block[0]
        if norm is None or document is None:
            continue
        assert isinstance(cid, str)  # _validate_claim accepted the claim: its required id is a string
        claims.append(
            Claim(
                id=cid,
                document=document,
                source=raw.get("source", document.title),
                location=raw["location"],
                statement=" ".join(raw["statement"].split()),
                kind=raw["kind"],
                checkers=tuple(raw["checkers"]),
                params=_freeze(raw.get("params", {})),
                formula=raw.get("formula"),
                claimed_value=raw.get("claimed_value"),
                claimed_percent=norm["percent"],
                relation=raw.get("relation", "="),
                action=raw.get("action"),
                expected=raw.get("expected", "holds"),
                corrected_action=raw.get("corrected_action"),
                models=norm["models"],
                note=raw.get("note"),
                rule=norm["rule"],
                file=shown,
                line=block[0],
            )
        )
    fail.raise_if_any()
    assert document is not None  # every way _validate_document refuses reports a problem
    return document, claims


def catalog_files(directory: Path = CATALOG_DIR) -> list[Path]:
    """The catalog proper: ``claims/*.toml`` (sub-folders such as ``examples/`` are not included)."""
    return sorted(directory.glob("*.toml"))


def load_catalog(paths: Iterable[Path | str] | None = None) -> dict[str, Claim]:
    """Load and validate claim files (default: every ``claims/*.toml``); ids are unique across files.
    Problems of every file are reported together."""
    files = catalog_files() if paths is None else [Path(p) for p in paths]
    out: dict[str, Claim] = {}
    problems: list[str] = []
    for path in files:
        try:
            _, claims = load_file(path)
        except GaugeAuditError as exc:
            problems += exc.lines
            continue
        for c in claims:
            if c.id in out:
                prev = out[c.id]
                text = Path(path).read_text(encoding="utf-8")
                line = _key_line(text, _claim_blocks(text)[[x.id for x in claims].index(c.id)], "id")
                problems.append(
                    f"{c.file}:{line}: field id: duplicate id {c.id!r} (already defined at {prev.file}:{prev.line})"
                )
                continue
            out[c.id] = c
    if problems:
        raise GaugeAuditError(*problems)
    return out


def get_claim(claim_id: str, catalog: Mapping[str, Claim] | None = None) -> Claim:
    catalog = load_catalog() if catalog is None else catalog
    try:
        return catalog[claim_id]
    except KeyError:
        raise GaugeAuditError(f"unknown claim id {claim_id!r} (see `gauge-audit claims`)") from None


__all__ = [
    "CATALOG_DIR",
    "CHECKERS",
    "KINDS",
    "Claim",
    "Document",
    "Unchecked",
    "catalog_files",
    "get_claim",
    "load_catalog",
    "load_file",
    "load_unchecked",
]
