"""The matrix-expression language of transformation rules (``[claim.rule.maps]``).

A rule writes each parameter's new value the way a paper does, e.g. ``W_K @ inv(transpose(M))``
or ``b_O - c @ W_O``.  The text is parsed by the tokenizer and recursive-descent parser below
into an :class:`Node` tree whose every node carries its shape (in dimension names such as
``d_model`` or numbers) and whether it is known to be invertible.  Nothing is evaluated as
code: no ``eval``/``exec``/``sympify``; every character outside the grammar is an error that
names its position.  The tree is later evaluated by :mod:`gauge_audit.rules.algebra` on torch
tensors, SymPy matrices or exact / mpmath nested lists.

Grammar (``@`` and ``*`` share one precedence level and associate to the left, as in Python)::

    expr    := term (('+' | '-') term)*
    term    := unary (('@' | '*') unary)*
    unary   := ('+' | '-') unary | atom
    atom    := NUMBER | NAME | FUNC '(' args ')' | '(' expr ')'
    FUNC    := inv | transpose | diag | outer | ones | eye      (ones(n), eye(n) take a dimension)

Values are matrices: a parameter vector (a bias, a norm weight) is a 1×n row vector (row-vector
convention y = x·W), a scalar is 1×1.  ``@`` is the matrix product, ``*`` a scalar times a matrix
or the element-wise product of two equal shapes, ``+``/``-`` need equal shapes, ``diag(v)`` makes
the n×n diagonal matrix of a vector, ``outer(u, v)`` = uᵀ·v, ``ones(n)`` the 1×n all-ones row,
``eye(n)`` the n×n identity.

Invertibility is tracked so that ``inv`` of something that need not be invertible is refused
when the file is loaded: ``group`` (a group element, ``eye``, ``diag`` of a vector whose entries
cannot vanish, products and inverses of those), ``generic`` (built from parameters: invertible at
a generic parameter point, checked again when applied), ``none`` (translations, sums, outer
products, zero).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .tokens import Token, TokenParser
from .tokens import tokenize as tokenize_text

Dim = int | str
Shape = tuple  # (rows: Dim, cols: Dim)

DIM_NAMES = ("d_model", "d_k", "d_v", "d_ff", "n_heads", "n_kv_heads", "vocab", "n_ctx", "n_experts")
FUNCTIONS = {"inv": 1, "transpose": 1, "diag": 1, "outer": 2, "ones": 1, "eye": 1}
GROUP, GENERIC, NONE = "group", "generic", "none"  # invertibility classes, strongest first
_RANK = {GROUP: 2, GENERIC: 1, NONE: 0}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
MAX_DEPTH = 60
MAX_EXPONENT = 300


@dataclass(frozen=True)
class Symbol:
    """What a name in an expression stands for: its shape, invertibility class and kind."""

    shape: Shape
    inv: str  # group | generic | none
    kind: str  # "param" or "element"
    label: str = ""  # e.g. "s ∈ translation(d_v)", for error messages


@dataclass(frozen=True)
class Node:
    op: str  # num name matmul mul add sub neg inv transpose diag outer ones eye
    shape: Shape
    inv: str
    args: tuple = ()
    value: Fraction | None = None  # num
    name: str | None = None  # name
    dim: Dim | None = None  # ones / eye
    pos: int = field(default=0, compare=False)

    def names(self) -> set[str]:
        """Every name the expression refers to."""
        out = {self.name} if self.op == "name" and self.name is not None else set()
        for a in self.args:
            out |= a.names()
        return out

    def text(self) -> str:
        """The expression in the rule language (canonical spacing, minimal parentheses)."""
        return _render(self, 0)


_PREC = {"add": 1, "sub": 1, "matmul": 2, "mul": 2, "neg": 3}


def _render(n: Node, outer: int) -> str:
    if n.op == "num":
        v = n.value
        assert v is not None  # the parser gives every num node its value
        s = str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
        if v.denominator != 1:
            s = f"({s})"
        return s
    if n.op == "name":
        assert n.name is not None  # the parser gives every name node its name
        return n.name
    if n.op in ("ones", "eye"):
        return f"{n.op}({n.dim})"
    if n.op in ("inv", "transpose", "diag", "outer"):
        return f"{n.op}({', '.join(_render(a, 0) for a in n.args)})"
    if n.op == "add" and n.args[1].op == "neg":  # a + -(b) reads a - b
        n = Node("sub", n.shape, n.inv, (n.args[0], n.args[1].args[0]))
    p = _PREC[n.op]
    if n.op == "neg":
        s = "-" + _render(n.args[0], p)
    else:
        sym = {"add": " + ", "sub": " - ", "matmul": " @ ", "mul": " * "}[n.op]
        # left-associative: the right operand needs parentheses at equal precedence
        s = _render(n.args[0], p) + sym + _render(n.args[1], p + 1)
    return f"({s})" if p < outer else s


def dims_compatible(a: Dim, b: Dim) -> bool:
    """Equal, or one a number > 1 and the other a name (decided when applied to a model).  A 1 is
    the row of a vector or a scalar and never stands for a named dimension."""
    if a == b:
        return True
    if isinstance(a, int) == isinstance(b, int):
        return False
    n = a if isinstance(a, int) else b
    return isinstance(n, int) and n > 1


def _join(a: Dim, b: Dim) -> Dim:
    return a if isinstance(a, str) else b


def shape_text(s: Shape) -> str:
    return f"{s[0]}×{s[1]}"


def tokenize(text: str) -> list[Token]:
    return tokenize_text(text, "expression", _NAME, "+-*@(),")


class _Parser(TokenParser):
    noun = "expression"

    def __init__(self, text: str, symbols: Mapping[str, Symbol]):
        super().__init__(text, tokenize(text))
        self.symbols = symbols

    def nest(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.error("expression nested too deeply")

    # -- grammar ---------------------------------------------------------------------------
    def parse(self) -> Node:
        if self.peek().kind == "END":
            self.error("empty expression")
        node = self.expr()
        if self.peek().kind != "END":
            self.error(f"unexpected {self.peek().text!r}")
        return node

    def expr(self) -> Node:
        self.nest()
        node = self.term()
        while self.peek().kind == "OP" and self.peek().text in "+-":
            tok = self.take()
            rhs = self.term()
            if node.shape != rhs.shape and not all(dims_compatible(a, b) for a, b in zip(node.shape, rhs.shape)):
                self.error(
                    f"'{tok.text}' needs equal shapes, got {shape_text(node.shape)} and {shape_text(rhs.shape)}", tok
                )
            shape = tuple(_join(a, b) for a, b in zip(node.shape, rhs.shape))
            node = Node("add" if tok.text == "+" else "sub", shape, NONE, (node, rhs), pos=tok.pos)
        self.depth -= 1
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.peek().kind == "OP" and self.peek().text in "@*":
            tok = self.take()
            rhs = self.unary()
            node = self.product(tok, node, rhs)
        return node

    def product(self, tok: Token, a: Node, b: Node) -> Node:
        inv = min(a.inv, b.inv, key=_RANK.__getitem__)
        if tok.text == "@":
            if not dims_compatible(a.shape[1], b.shape[0]):
                self.error(
                    f"'@' needs inner dimensions to agree, got {shape_text(a.shape)} @ {shape_text(b.shape)}", tok
                )
            square = all(dims_compatible(*x.shape) for x in (a, b))
            return Node("matmul", (a.shape[0], b.shape[1]), inv if square else NONE, (a, b), pos=tok.pos)
        if a.shape == (1, 1):
            return Node("mul", b.shape, inv, (a, b), pos=tok.pos)
        if b.shape == (1, 1):
            return Node("mul", a.shape, inv, (a, b), pos=tok.pos)
        if not all(dims_compatible(x, y) for x, y in zip(a.shape, b.shape)):
            self.error(
                f"'*' is a scalar times a matrix or an element-wise product of equal shapes, got "
                f"{shape_text(a.shape)} * {shape_text(b.shape)}",
                tok,
            )
        # element-wise: vectors with non-vanishing entries keep them (diag of the product is invertible);
        # an element-wise product of matrices need not be invertible
        shape = tuple(_join(x, y) for x, y in zip(a.shape, b.shape))
        return Node("mul", shape, inv if 1 in shape else NONE, (a, b), pos=tok.pos)

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "OP" and tok.text in "+-":
            self.take()
            self.nest()
            inner = self.unary()
            self.depth -= 1
            return inner if tok.text == "+" else Node("neg", inner.shape, inner.inv, (inner,), pos=tok.pos)
        return self.atom()

    def dimension(self) -> Dim:
        tok = self.take()
        if tok.kind == "NUM" and tok.text.isdigit() and 1 <= int(tok.text) <= 100000:
            return int(tok.text)
        if tok.kind == "NAME" and tok.text in DIM_NAMES:
            return tok.text
        self.error(f"expected a dimension (a positive integer or one of {', '.join(DIM_NAMES)})", tok)

    def atom(self) -> Node:
        tok = self.take()
        if tok.kind == "NUM":
            mantissa, _, exp10 = tok.text.lower().partition("e")
            if len(mantissa) > 64 or (exp10 and abs(int(exp10)) > MAX_EXPONENT):
                self.error(f"number {tok.text[:20]!r} too long or too large", tok)
            value = Fraction(tok.text)
            return Node("num", (1, 1), GROUP if value != 0 else NONE, value=value, pos=tok.pos)
        if tok.kind == "NAME":
            if self.peek().kind == "OP" and self.peek().text == "(":
                return self.call(tok)
            if tok.text in FUNCTIONS:
                self.error(f"function {tok.text!r} needs parentheses", tok)
            sym = self.symbols.get(tok.text)
            if sym is None:
                known = sorted(self.symbols)
                hint = "" if len(known) > 40 else f" (known: {', '.join(known)})"
                self.error(f"unknown name {tok.text!r}{hint}", tok)
            return Node("name", sym.shape, sym.inv, name=tok.text, pos=tok.pos)
        if tok.kind == "OP" and tok.text == "(":
            node = self.expr()
            self.expect(")")
            return node
        self.error("expected a number, a name, a function or '('" if tok.kind != "END" else "unexpected end", tok)

    def call(self, tok: Token) -> Node:
        fn = tok.text
        if fn not in FUNCTIONS:
            self.error(f"unknown function {fn!r} (allowed: {', '.join(FUNCTIONS)})", tok)
        self.take()  # (
        if fn in ("ones", "eye"):
            d = self.dimension()
            self.expect(")")
            if fn == "ones":
                return Node("ones", (1, d), GROUP, dim=d, pos=tok.pos)
            return Node("eye", (d, d), GROUP, dim=d, pos=tok.pos)
        args = [self.expr()]
        while self.peek().kind == "OP" and self.peek().text == ",":
            self.take()
            args.append(self.expr())
        self.expect(")")
        if len(args) != FUNCTIONS[fn]:
            self.error(f"{fn}() takes {FUNCTIONS[fn]} argument(s), got {len(args)}", tok)
        a = args[0]
        if fn == "transpose":
            return Node("transpose", (a.shape[1], a.shape[0]), a.inv, (a,), pos=tok.pos)
        if fn == "inv":
            if not dims_compatible(a.shape[0], a.shape[1]):
                self.error(f"inv() needs a square matrix, got {shape_text(a.shape)}", tok)
            if a.shape == (1, 1) and a.op == "num" and a.value == 0:
                self.error("inv(0) is undefined", tok)
            if a.inv == NONE:
                self.error(f"inv({a.text()}) is not guaranteed to exist: {self.why_singular(a)}", tok)
            return Node("inv", a.shape, a.inv, (a,), pos=tok.pos)
        if fn == "diag":
            if a.shape[0] == 1:
                n = a.shape[1]
            elif a.shape[1] == 1:
                n = a.shape[0]
            else:
                self.error(f"diag() takes a vector (1×n or n×1), got {shape_text(a.shape)}", tok)
            return Node("diag", (n, n), a.inv, (a,), pos=tok.pos)
        # outer(u, v) = uᵀ·v for row vectors (column vectors are taken as they are)
        b = args[1]
        for v in (a, b):
            if 1 not in v.shape:
                self.error(f"outer() takes two vectors, got {shape_text(v.shape)}", tok)
        m = a.shape[1] if a.shape[0] == 1 else a.shape[0]
        n = b.shape[1] if b.shape[0] == 1 else b.shape[0]
        return Node("outer", (m, n), NONE, (a, b), pos=tok.pos)

    def why_singular(self, n: Node) -> str:
        if n.op in ("add", "sub"):
            return "a sum or difference need not be invertible"
        if n.op == "outer":
            return "an outer product has rank one"
        if n.op == "diag":
            return "the vector's entries may vanish: " + self.why_singular(n.args[0])
        if n.op == "num":
            return "it is zero"
        if n.op == "name":
            assert n.name is not None  # the parser gives every name node its name
            sym = self.symbols[n.name]
            return f"{sym.label or n.name} is not invertible"
        bad = [a for a in n.args if a.inv == NONE]
        if n.op == "matmul" and not bad:
            return "a product of non-square factors"
        if n.op == "mul" and not bad:
            return "an element-wise product of matrices"
        return self.why_singular(bad[0]) if bad else "it may be singular"


def parse_expression(text: str, symbols: Mapping[str, Symbol]) -> Node:
    """Parse ``text`` against the known ``symbols`` (parameters and the rule's elements)."""
    return _Parser(text, symbols).parse()


__all__ = [
    "DIM_NAMES",
    "FUNCTIONS",
    "GROUP",
    "GENERIC",
    "NONE",
    "Dim",
    "Node",
    "Symbol",
    "dims_compatible",
    "parse_expression",
    "shape_text",
    "tokenize",
]
