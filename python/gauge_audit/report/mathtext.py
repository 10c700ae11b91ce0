"""Typeset the checkers' plain-text mathematics as HTML, with no script and nothing fetched.

The evidence strings carry SymPy's text form (``Matrix([[a_00**2 - 1, a_01], ...])``, ``g(0)^-1``,
``d_k**2``) and Markdown backticks.  :func:`typeset` turns them into HTML: matrices as bracketed
grids, powers as superscripts, index suffixes as subscripts, ``*`` as ``·``, backticks as
``<code>``.  It is a scanner over the text, never an evaluator: anything it does not recognise is
shown escaped, as it was.
"""

from __future__ import annotations

import html
import re

_MATRIX = "Matrix(["
_POWER = re.compile(r"\*\*(\(?-?[0-9A-Za-z]+\)?)|\^(\(?-?[0-9A-Za-zT]+\)?)")
# a one-letter name with an index (a_00, d_k, W_Q), not a word_with_underscores
_SUB = re.compile(r"(?<![\w])([^\W\d_])_([0-9]{1,3}|[^\W\d_])(?![\w])")
_CODE = re.compile(r"`([^`]+)`")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _closing(text: str, start: int) -> int:
    """Index just past the bracket that closes the one opened at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _matrix(inner: str) -> str | None:
    """``[[a, b], [c, d]]`` (the text inside ``Matrix(…)``) as an HTML grid, or None."""
    inner = inner.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        return None
    rows = _split_top(inner[1:-1])
    cells = []
    for row in rows:
        row = row.strip()
        if row.startswith("[") and row.endswith("]"):
            cells.append(_split_top(row[1:-1]))
        else:
            cells.append([row])
    body = "".join("<tr>" + "".join(f"<td>{_expr(c)}</td>" for c in r) + "</tr>" for r in cells)
    return f"<table class='mx'>{body}</table>"


def _expr(text: str) -> str:
    """One expression without matrices: escape, then powers, subscripts and products."""
    out = html.escape(text)
    out = _POWER.sub(lambda m: f"<sup>{(m.group(1) or m.group(2)).strip('()').replace('-', '−')}</sup>", out)
    out = _SUB.sub(r"\1<sub>\2</sub>", out)
    out = re.sub(r"(?<=[\w)\]>])\*(?=[\w(])", "·", out)
    return out


def typeset(text: str) -> str:
    """HTML for one evidence / rule / counterexample string."""
    text = str(text)
    pieces, i = [], 0
    while True:
        j = text.find(_MATRIX, i)
        if j < 0:
            pieces.append(_inline(text[i:]))
            break
        end = _closing(text, j + len("Matrix"))
        grid = _matrix(text[j + len("Matrix") + 1 : end - 1]) if end > 0 else None
        if grid is None:
            pieces.append(_inline(text[i : j + len(_MATRIX)]))
            i = j + len(_MATRIX)
            continue
        pieces.append(_inline(text[i:j]))
        pieces.append(grid)
        i = end
    return "".join(pieces)


def _inline(text: str) -> str:
    """Text with backtick spans as code (their content verbatim) and the rest typeset."""
    out, last = [], 0
    for m in _CODE.finditer(text):
        out.append(_expr(text[last : m.start()]))
        out.append(f"<code>{html.escape(m.group(1))}</code>")
        last = m.end()
    out.append(_expr(text[last:]))
    return "".join(out)
