"""Shortening text for tables without cutting an expression."""

from __future__ import annotations


def brief(text: str, width: int) -> str:
    """The leading clauses of ``text`` that fit in ``width`` characters, cut only at a clause
    boundary ("; " or ". " outside brackets, or before a parenthetical), never inside an expression; "…" marks what was left
    for the report.  A first clause longer than ``width`` is kept whole (the table wraps it)."""
    cuts, depth = [], 0
    for i, ch in enumerate(text):
        depth += ch in "([{" and 1 or (ch in ")]}" and -1 or 0)
        if depth == 0 and ch in ";." and text[i + 1 : i + 2] == " ":
            cuts.append(i)
        elif depth == 1 and ch == "(" and text[i - 1 : i] == " ":  # before a parenthetical
            cuts.append(i - 1)
    if len(text) <= width:
        return text
    fit = [i for i in cuts if i + 2 <= width]
    end = fit[-1] if fit else (cuts[0] if cuts else len(text))
    return text[:end] + (" …" if end < len(text) else "")


def nearest_text(n: dict) -> str:
    """A nearest true statement in one line: the statement, the sizes and checkers that confirmed it."""
    sizes = " and ".join(
        "(" + ", ".join(f"{k} {v}" for k, v in sz.items() if k in ("d_model", "d_k", "d_ff")) + ")"
        for sz in n.get("checked_at_sizes", [])
        if sz
    )
    text = n["statement"] + (f" — symbolic at the sizes {sizes}" if sizes else "")
    others = [c for c in n.get("confirmed_by", []) if c != "symbolic"]
    if others:
        text += f"; confirmed by {', '.join(others)}"
    if n.get("contradicted_by"):
        text += f"; NOT confirmed by {', '.join(n['contradicted_by'])}"
    return text
