"""The token stream both restricted parsers of claim files share (formulas: :mod:`.expr`, rule
expressions: :mod:`.matexpr`): look-ahead, consumption and one-line errors that name the position."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn

from ..errors import GaugeAuditError

NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
MAX_LEN = 2000


@dataclass(frozen=True)
class Token:
    kind: str  # NUM, NAME, OP, END
    text: str
    pos: int


def tokenize(text: str, noun: str, name: re.Pattern, ops: str, aliases: dict[str, str] | None = None) -> list[Token]:
    """Numbers, names (``name``), one-character operators (``ops``) and multi-character spellings of
    them (``aliases``, e.g. ``**`` → ``^``); blanks skipped; any other character is a one-line error."""
    if not isinstance(text, str):
        raise GaugeAuditError(f"{noun} must be a string")
    if len(text) > MAX_LEN:
        raise GaugeAuditError(f"{noun} longer than {MAX_LEN} characters")
    out: list[Token] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in " \t":
            i += 1
            continue
        m = NUMBER.match(text, i) if (c.isdigit() or c == ".") else None
        if m:
            out.append(Token("NUM", m.group(0), i))
            i = m.end()
            continue
        m = name.match(text, i)
        if m:
            out.append(Token("NAME", m.group(0), i))
            i = m.end()
            continue
        alias = next((a for a in (aliases or {}) if text.startswith(a, i)), None)
        if alias:
            out.append(Token("OP", (aliases or {})[alias], i))
            i += len(alias)
            continue
        if c in ops:
            out.append(Token("OP", c, i))
            i += 1
            continue
        raise GaugeAuditError(f"{noun} {text!r}: unexpected character {c!r} at position {i}")
    out.append(Token("END", "", len(text)))
    return out


class TokenParser:
    """Base of a recursive-descent parser over ``self.toks``; ``noun`` names the input in errors."""

    noun = "input"

    def __init__(self, text: str, toks: list[Token]):
        self.text, self.toks = text, toks
        self.i = 0
        self.depth = 0

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def error(self, msg: str, tok: Token | None = None) -> NoReturn:
        tok = tok or self.peek()
        where = f"end of {self.noun}" if tok.kind == "END" else f"position {tok.pos}"
        raise GaugeAuditError(f"{self.noun} {self.text!r}: {msg} at {where}")

    def expect(self, op: str):
        tok = self.peek()
        if tok.kind != "OP" or tok.text != op:
            self.error(f"expected {op!r}")
        self.take()


__all__ = ["MAX_LEN", "NUMBER", "Token", "TokenParser", "tokenize"]
