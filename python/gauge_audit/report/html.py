"""``report.html``: the verdict table with a one-line reason per claim, each claim's details
(rule, corrected rule, counterexample, every checker's evidence, derivation steps, residual tables)
folded below its row, then the named figures and the checkers' tables.  Self-contained: the plots
are embedded, the mathematics is typeset by :mod:`.mathtext` as HTML, no script, nothing fetched."""

from __future__ import annotations

import base64
import html

from ..audit.plots import FIGURE_TITLES
from .mathtext import typeset
from .text import brief, nearest_text

_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
th{background:#f3f3f3}.HOLDS{background:#e3f6e3}.FAILS{background:#fbe3e3}.HOLDS-WITH-CORRECTION{background:#fff3d6}
.UNDECIDED{background:#eee}code{background:#f5f5f5;padding:0 3px}img{max-width:100%}blockquote{color:#555;margin:.5em 1em}
tr.detail>td{border-top:none;background:#fcfcfc}details>summary{cursor:pointer;color:#246}
table.mx{display:inline-table;border-left:1.5px solid #444;border-right:1.5px solid #444;margin:2px 4px;vertical-align:middle;font-size:13px}
table.mx td{border:none;padding:1px 6px;text-align:center}table.res td,table.res th{font-size:13px}
.ev{margin:.6em 0}.ev h4{margin:.2em 0;font-size:14px}figure{margin:1.5em 0}figcaption{font-style:italic;color:#444}
sub,sup{font-size:75%}"""

_RES_COLUMNS = (
    "rule",
    "model",
    "verdict",
    "max rel. error",
    "residual / ε",
    "statistical tol. / ε",
    "worst-case tol. / ε",
    "κ",
)


def _num(v, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "—"


def _residual_table(details: dict) -> str:
    """The torch rows of a checker: the stated rule's and the corrected rule's, each labelled."""
    rows = []
    for key, label in (("results", "stated"), ("corrected", "corrected")):
        for r in details.get(key) or []:
            if isinstance(r, dict) and "residual_eps" in r:
                rows.append((label, r))
    if not rows:
        return ""
    e = html.escape
    head = "".join(f"<th>{c}</th>" for c in _RES_COLUMNS)
    body = "".join(
        f"<tr><td>{label}</td><td>{e(str(r.get('model', '')))}</td><td class='{e(str(r.get('verdict', '')))}'>"
        f"{e(str(r.get('verdict', '')))}</td><td>{_num(r.get('max_rel_error'), '.3e')}</td>"
        f"<td>{_num(r.get('residual_eps'), '.4g')}</td><td>{_num(r.get('tolerance_statistical_eps'), '.4g')}</td>"
        f"<td>{_num(r.get('tolerance_eps'), '.4g')}</td><td>{_num(r.get('kappa'), '.3g')}</td></tr>"
        for label, r in rows
    )
    return f"<table class='res'><tr>{head}</tr>{body}</table>"


def _claim_details(c: dict) -> str:
    e = html.escape
    parts = [
        f"<p><i>{e(c['document'])}</i>, {e(c['location'])} ({e(c['file'])}:{c['line']}); kind "
        f"<code>{e(c['kind'])}</code></p><blockquote>{typeset(c['statement'])}</blockquote>"
    ]
    if c.get("rule"):
        parts.append(f"<p><b>Rule as stated:</b> {typeset(c['rule'])}</p>")
    parts.append(f"<p><b>Verdict:</b> {e(c['verdict'])} — {typeset(c['why'])}</p>")
    for label, key in (
        ("Corrected rule", "corrected_rule"),
        ("Counterexample", "counterexample"),
        ("Conflicts", "conflicts"),
    ):
        val = c.get(key)
        if val:
            val = "; ".join(val) if isinstance(val, list) else val
            parts.append(f"<p><b>{label}:</b> {typeset(val)}</p>")
    if c.get("nearest"):
        n = c["nearest"]
        parts.append(
            f"<p><b>Nearest true statement:</b> {typeset(nearest_text(n))}<br>as a rule: {typeset(n['rule_text'])}</p>"
        )
    for checker, ev in c["evidence"].items():
        details = ev.get("details") or {}
        parts.append(
            f"<div class='ev'><h4>{e(checker)} — <span class='{e(ev['outcome'])}'>{e(ev['outcome'])}"
            f"</span></h4><p>{typeset(ev['summary'])}</p>"
        )
        if details.get("steps"):
            parts.append("<ol>" + "".join(f"<li>{typeset(s)}</li>" for s in details["steps"]) + "</ol>")
        parts.append(_residual_table(details) + "</div>")
    return "".join(parts)


def _extras(extras: dict) -> list[dict]:
    return [extras[k] for k in sorted(extras) if isinstance(extras[k], dict) and "rows" in extras[k]]


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def reason(c: dict, width: int = 160) -> str:
    """One line: the verdict's reason, then what decides it — the corrected rule or the counterexample."""
    decisive = c.get("corrected_rule") or c.get("counterexample")
    why = brief(c["why"], width // 3).removesuffix(" …")  # its checker list stays in the details
    return why + (f": {brief(decisive, width - len(why))}" if decisive else "")


def render(data: dict, plots: dict[str, bytes]) -> str:
    """``data`` is report.json's content; ``plots`` maps a figure's file name to its PNG bytes."""
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gauge-audit report</title>",
        f"<style>{_CSS}</style></head><body><h1>gauge-audit report</h1>",
        f"<p>Seed {data['seed']}{' (full)' if data.get('full') else ''}. Verdicts: "
        + ", ".join(f"{e(v)} {n}" for v, n in data["summary"].items())
        + ". Each row's details (the rule, "
        "the corrected rule, the counterexample, every checker's evidence with its derivation steps and "
        "residuals) open below it.</p>",
        "<table><tr><th>claim</th><th>source</th><th>verdict</th><th>reason</th></tr>",
    ]
    for c in data["claims"]:
        src = f"{c['document']}, {c['location']}"
        outcomes = ", ".join(f"{k} {v['outcome']}" for k, v in c["evidence"].items())
        parts.append(
            f"<tr id='{e(c['id'])}'><td><code>{e(c['id'])}</code></td><td>{e(src)}</td>"
            f"<td class='{e(c['verdict'])}'><b>{e(c['verdict'])}</b></td>"
            f"<td>{typeset(reason(c))}</td></tr>"
            f"<tr class='detail'><td colspan='4'><details><summary>details: "
            f"{e(outcomes)}</summary>"
            f"{_claim_details(c)}</details></td></tr>"
        )
    parts.append("</table>")
    for n, (name, png) in enumerate(sorted(plots.items()), 1):
        title = FIGURE_TITLES.get(name, name)
        parts.append(
            f"<figure><img alt='{e(title)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
            f"<figcaption>Figure {n}. {e(title)}</figcaption></figure>"
        )
    for ex in _extras(data.get("extras", {})):
        parts.append(
            f"<h2>{e(ex['title'])}</h2>"
            + (f"<p>{typeset(ex['note'])}</p>" if ex.get("note") else "")
            + "<table><tr>"
            + "".join(f"<th>{e(c)}</th>" for c in ex["columns"])
            + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{typeset(_fmt(v))}</td>" for v in row) + "</tr>" for row in ex["rows"])
            + "</table>"
        )
    parts.append("</body></html>\n")
    return "".join(parts)
