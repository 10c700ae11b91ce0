"""A restricted formula language for claim files.

Claim files may carry formulas such as ``2*n_t*n_h*d_h^2 + (d_e-1)*(d_e-2)/2`` or
``h*(d_k^2+d_v^2) + log(h!)``.  They are parsed by the small tokenizer and
recursive-descent parser below into SymPy objects.  Nothing in a claim file is
ever evaluated as code: there is no ``eval``/``exec`` and no ``sympify`` /
``parse_expr`` of file text.  Only numbers, identifiers, ``+ - * / ^ **``,
postfix ``!``, parentheses and the whitelisted functions in :data:`FUNCTIONS`
are accepted; every other character is an error that names its position.

Grammar (``^`` and ``**`` are the same operator, right-associative)::

    expr    := term (('+' | '-') term)*
    term    := unary (('*' | '/') unary)*
    unary   := ('+' | '-') unary | power
    power   := postfix (('^' | '**') unary)?
    postfix := atom '!'*
    atom    := NUMBER | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import sympy as sp

from ..errors import GaugeAuditError
from .tokens import Token, TokenParser
from .tokens import tokenize as tokenize_text

#: function name -> (SymPy callable, number of arguments)
FUNCTIONS = {
    "log": (sp.log, 1),
    "ln": (sp.log, 1),
    "sqrt": (sp.sqrt, 1),
    "exp": (sp.exp, 1),
    "factorial": (sp.factorial, 1),
    "binomial": (sp.binomial, 2),
    "min": (sp.Min, 2),
    "max": (sp.Max, 2),
}

#: named constants
CONSTANTS = {"pi": sp.pi}

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_MAX_DIGITS = 4000  # numeric literals and numeric powers stay below 10^_MAX_DIGITS
_MAX_FACTORIAL = 1000  # numeric factorial / binomial arguments


def tokenize(text: str) -> list[Token]:
    return tokenize_text(text, "formula", _NAME, "+-*/^()!,", {"**": "^"})


class _Parser(TokenParser):
    noun = "formula"

    def __init__(self, text: str, names: frozenset[str] | None, symbols: dict[str, sp.Symbol]):
        super().__init__(text, tokenize(text))
        self.names = names
        self.symbols = symbols

    # -- grammar ---------------------------------------------------------------------------
    def parse(self) -> sp.Expr:
        if self.peek().kind == "END":
            self.error("empty formula")
        value = self.expr()
        if self.peek().kind != "END":
            self.error(f"unexpected {self.peek().text!r}")
        return value

    def checked(self, value, tok: Token | None = None):
        """Refuse non-finite numbers and numbers beyond 10^_MAX_DIGITS (SymPy would carry them on)."""
        if value.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
            self.error("the formula is undefined (division by zero or infinity)", tok)
        if value.is_Rational:
            bits = max(int(value.p).bit_length(), int(value.q).bit_length())
            if bits * 0.30103 > _MAX_DIGITS:
                self.error(f"number too large (about 10^{bits * 0.30103:.3g})", tok)
        return value

    def expr(self):
        self.depth += 1
        if self.depth > 100:
            self.error("formula nested too deeply")
        value = self.term()
        while self.peek().kind == "OP" and self.peek().text in "+-":
            tok = self.take()
            rhs = self.term()
            value = self.checked(value + rhs if tok.text == "+" else value - rhs, tok)
        self.depth -= 1
        return value

    def term(self):
        value = self.unary()
        while self.peek().kind == "OP" and self.peek().text in "*/":
            tok = self.take()
            rhs = self.unary()
            if tok.text == "*":
                value = self.checked(value * rhs, tok)
            else:
                if rhs == 0:
                    self.error("division by zero", tok)
                value = self.checked(value / rhs, tok)
        return value

    def unary(self):
        tok = self.peek()
        if tok.kind == "OP" and tok.text in "+-":
            self.take()
            self.depth += 1
            if self.depth > 100:
                self.error("formula nested too deeply")
            inner = self.unary()
            self.depth -= 1
            return -inner if tok.text == "-" else inner
        return self.power()

    def power(self):
        base = self.postfix()
        if self.peek().kind == "OP" and self.peek().text == "^":
            tok = self.take()
            exponent = self.unary()
            if base.is_Number and exponent.is_Number and base != 0:
                # SymPy evaluates numeric powers eagerly: refuse results beyond _MAX_DIGITS digits
                digits = abs(float(exponent)) * max(abs(sp.log(abs(base), 10).evalf(15)), 1)
                if digits > _MAX_DIGITS:
                    self.error(f"number too large (about 10^{digits:.3g})", tok)
            return self.checked(sp.Pow(base, exponent), tok)
        return base

    def postfix(self):
        value = self.atom()
        while self.peek().kind == "OP" and self.peek().text == "!":
            tok = self.take()
            if value.is_Number and abs(value) > _MAX_FACTORIAL:
                self.error(f"factorial argument too large (> {_MAX_FACTORIAL})", tok)
            value = self.checked(sp.factorial(value), tok)
        return value

    def atom(self):
        tok = self.take()
        if tok.kind == "NUM":
            mantissa, _, exp10 = tok.text.lower().partition("e")
            if len(mantissa) > 64 or (exp10 and abs(int(exp10)) > _MAX_DIGITS):
                self.error(f"number {tok.text[:20]!r} too long or too large", tok)
            return sp.Rational(tok.text)  # exact: "1.3" -> 13/10
        if tok.kind == "NAME":
            if self.peek().kind == "OP" and self.peek().text == "(":
                if tok.text not in FUNCTIONS:
                    self.error(f"unknown function {tok.text!r} (allowed: {', '.join(sorted(FUNCTIONS))})", tok)
                fn, arity = FUNCTIONS[tok.text]
                self.take()
                args = [self.expr()]
                while self.peek().kind == "OP" and self.peek().text == ",":
                    self.take()
                    args.append(self.expr())
                self.expect(")")
                if len(args) != arity:
                    self.error(f"{tok.text}() takes {arity} argument(s), got {len(args)}", tok)
                if tok.text in ("factorial", "binomial") and any(a.is_Number and abs(a) > _MAX_FACTORIAL for a in args):
                    self.error(f"{tok.text}() argument too large (> {_MAX_FACTORIAL})", tok)
                return self.checked(fn(*args), tok)
            if tok.text in CONSTANTS:
                return CONSTANTS[tok.text]
            if tok.text in FUNCTIONS:
                self.error(f"function {tok.text!r} needs parentheses", tok)
            if self.names is not None and tok.text not in self.names:
                self.error(f"unknown name {tok.text!r} (allowed: {', '.join(sorted(self.names))})", tok)
            if tok.text not in self.symbols:
                self.symbols[tok.text] = sp.Symbol(tok.text, positive=True)
            return self.symbols[tok.text]
        if tok.kind == "OP" and tok.text == "(":
            value = self.expr()
            self.expect(")")
            return value
        self.error("expected a number, a name or '('" if tok.kind != "END" else "unexpected end", tok)


def parse_formula(text: str, names: Iterable[str] | None = None) -> sp.Expr:
    """Parse ``text`` into a SymPy expression.

    ``names``, when given, is the whitelist of identifiers (typically the keys of the
    claim's ``params``); any other identifier is an error.  Identifiers become positive
    SymPy symbols of the same name.
    """
    allowed = None if names is None else frozenset(names)
    return _Parser(text, allowed, {}).parse()


def formula_symbols(expr: sp.Expr) -> dict[str, sp.Symbol]:
    return {s.name: s for s in expr.free_symbols}


def evaluate_formula(text: str, values: Mapping[str, object]) -> sp.Expr:
    """Parse and substitute numeric parameter values (ints/floats from the claim file)."""
    expr = parse_formula(text, names=values.keys())
    subs = {}
    for name, sym in formula_symbols(expr).items():
        v = values[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GaugeAuditError(f"formula {text!r}: parameter {name!r} is not a number")
        subs[sym] = sp.Integer(v) if isinstance(v, int) else sp.Rational(str(v))
    return sp.simplify(expr.subs(subs))
