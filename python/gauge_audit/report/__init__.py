"""Write an audit as ``report.json`` (deterministic for a seed), ``report.md``,
a self-contained ``report.html`` (plots embedded) and ``timings.json``."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path

from ..audit.run import AuditReport

VERDICT_ORDER = ("HOLDS", "HOLDS-WITH-CORRECTION", "FAILS", "UNDECIDED")


def _json_dump(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=True) + "\n"


def write(report: AuditReport, out: Path, plots: dict[str, bytes] | None = None) -> dict[str, Path]:
    """Write every report file into ``out``; ``plots`` maps a file name to PNG bytes."""
    out.mkdir(parents=True, exist_ok=True)
    plots = plots or {}
    paths = {}
    for name, png in sorted(plots.items()):
        (out / name).write_bytes(png)
        paths[name] = out / name
    paths["report.json"] = out / "report.json"
    paths["report.json"].write_text(_json_dump(report.to_json()), encoding="utf-8")
    paths["timings.json"] = out / "timings.json"
    paths["timings.json"].write_text(_json_dump(report.timings), encoding="utf-8")
    paths["report.md"] = out / "report.md"
    paths["report.md"].write_text(markdown(report, sorted(plots)), encoding="utf-8")
    paths["report.html"] = out / "report.html"
    paths["report.html"].write_text(to_html(report, plots), encoding="utf-8")
    return paths


def table_rows(report: AuditReport) -> list[tuple[str, str, str, list[str]]]:
    """(claim id, source, verdict, ["checker: OUTCOME — summary", ...]) per claim."""
    rows = []
    for r in report.results:
        ev = [f"{e.checker}: {e.outcome} — {e.summary}" for e in r.evidence]
        rows.append((r.claim.id, f"{r.claim.document.key}, {r.claim.location}", r.verdict.verdict, ev))
    return rows


def terminal_table(report: AuditReport, width: int = 160) -> str:
    lines = [f"{'claim':28s} {'verdict':22s} {'source':34s} evidence"]
    lines.append("-" * min(width, 140))
    for cid, source, verdict, ev in table_rows(report):
        first = True
        for e in ev or ["(no checker)"]:
            text = e if len(e) <= width - 87 else e[: width - 90] + "..."
            lead = f"{cid:28s} {verdict:22s} {source[:34]:34s}" if first else " " * 86
            lines.append(f"{lead} {text}")
            first = False
    counts = report.to_json()["summary"]
    lines.append("")
    lines.append("verdicts: " + ", ".join(f"{v} {counts[v]}" for v in VERDICT_ORDER if v in counts))
    return "\n".join(lines)


def _md_cell(s: str) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def markdown(report: AuditReport, plot_names: Sequence[str] = ()) -> str:
    data = report.to_json()
    out = ["# gauge-audit report", "",
           f"Seed {report.seed}{' (full)' if report.full else ''}. Verdicts: "
           + ", ".join(f"{v} {n}" for v, n in data["summary"].items()) + ".", "",
           "| claim | source | verdict | evidence |", "|---|---|---|---|"]
    for cid, source, verdict, ev in table_rows(report):
        out.append(f"| `{cid}` | {_md_cell(source)} | **{verdict}** | {'<br>'.join(_md_cell(e) for e in ev)} |")
    out.append("")
    for name in plot_names:
        out += [f"![{name}]({name})", ""]
    for section in _extra_sections(data.get("extras", {})):
        out += section + [""]
    out += ["## Claims", ""]
    for c in data["claims"]:
        out += [f"### `{c['id']}` — {c['verdict']}", "", f"*{c['document']}*, {c['location']} "
                f"({c['file']}:{c['line']})", "", f"> {c['statement']}", ""]
        if c.get("rule"):
            out += [f"Rule: `{c['rule']}`", ""]
        out += [f"Verdict: **{c['verdict']}** — {c['why']}."]
        if c["conflicts"]:
            out += ["", "Conflicts: " + "; ".join(c["conflicts"])]
        if c["corrected_rule"]:
            out += ["", f"Corrected rule: {c['corrected_rule']}"]
        if c["counterexample"]:
            out += ["", f"Counterexample: {c['counterexample']}"]
        out.append("")
        for checker, e in c["evidence"].items():
            out.append(f"- **{checker}** ({e['outcome']}): {e['summary']}")
            steps = e.get("details", {}).get("steps")
            if steps:
                out += [f"    {i}. {_md_cell(s)}" for i, s in enumerate(steps, 1)]
            details = e.get("details", {})
            rows = [r for k in ("results", "corrected") if isinstance(details.get(k), list) for r in details[k]]
            for row in rows:
                if isinstance(row, dict) and "residual_eps" in row:
                    out.append(f"    - {row['model']}: {row['verdict']}, max rel error {row['max_rel_error']:.3e} "
                               f"= {row['residual_eps']:.4g} ε (tol {_stat(row)}{row['tolerance_eps']:.4g} ε worst-case, "
                               f"κ {row['kappa']:.3g})")
        out.append("")
    return "\n".join(out) + "\n"


def _stat(row: dict) -> str:
    v = row.get("tolerance_statistical_eps")
    return f"{v:.4g} ε statistical, " if isinstance(v, (int, float)) else ""


def _extras(extras: dict) -> list[dict]:
    """Tables contributed by the checkers: each {"title", "columns", "rows", "note"}."""
    return [extras[k] for k in sorted(extras) if isinstance(extras[k], dict) and "rows" in extras[k]]


def _extra_sections(extras: dict) -> list[list[str]]:
    sections = []
    for ex in _extras(extras):
        lines = [f"## {ex['title']}", ""] + ([ex["note"], ""] if ex.get("note") else [])
        lines += ["| " + " | ".join(ex["columns"]) + " |", "|" + "---|" * len(ex["columns"])]
        lines += ["| " + " | ".join(_md_cell(_fmt(v)) for v in row) + " |" for row in ex["rows"]]
        sections.append(lines)
    return sections


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
th{background:#f3f3f3}.HOLDS{background:#e3f6e3}.FAILS{background:#fbe3e3}.HOLDS-WITH-CORRECTION{background:#fff3d6}
.UNDECIDED{background:#eee}code{background:#f5f5f5;padding:0 3px}img{max-width:100%}blockquote{color:#555}"""


def to_html(report: AuditReport, plots: dict[str, bytes]) -> str:
    e = html.escape
    data = report.to_json()
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>gauge-audit report</title>",
             f"<style>{_CSS}</style></head><body><h1>gauge-audit report</h1>",
             f"<p>Seed {report.seed}{' (full)' if report.full else ''}. Verdicts: "
             + ", ".join(f"{e(v)} {n}" for v, n in data["summary"].items()) + ".</p>",
             "<table><tr><th>claim</th><th>source</th><th>verdict</th><th>evidence</th></tr>"]
    for cid, source, verdict, ev in table_rows(report):
        parts.append(f"<tr><td><a href='#{e(cid)}'><code>{e(cid)}</code></a></td><td>{e(source)}</td>"
                     f"<td class='{e(verdict)}'><b>{e(verdict)}</b></td><td>{'<br>'.join(e(x) for x in ev)}</td></tr>")
    parts.append("</table>")
    for name, png in sorted(plots.items()):
        parts.append(f"<h3>{e(name)}</h3><img alt='{e(name)}' src='data:image/png;base64,"
                     f"{base64.b64encode(png).decode()}'>")
    for ex in _extras(data.get("extras", {})):
        parts.append(f"<h2>{e(ex['title'])}</h2>" + (f"<p>{e(ex['note'])}</p>" if ex.get("note") else "")
                     + "<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in ex["columns"]) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{e(_fmt(v))}</td>" for v in row) + "</tr>" for row in ex["rows"])
                     + "</table>")
    parts.append("<h2>Claims</h2>")
    for c in data["claims"]:
        parts.append(f"<h3 id='{e(c['id'])}'><code>{e(c['id'])}</code> — <span class='{e(c['verdict'])}'>"
                     f"{e(c['verdict'])}</span></h3><p><i>{e(c['document'])}</i>, {e(c['location'])}</p>"
                     f"<blockquote>{e(c['statement'])}</blockquote>"
                     + (f"<p><b>Rule:</b> <code>{e(c['rule'])}</code></p>" if c.get("rule") else "")
                     + f"<p>{e(c['why'])}</p>")
        for label, key in (("Conflicts", "conflicts"), ("Corrected rule", "corrected_rule"),
                           ("Counterexample", "counterexample")):
            if c[key]:
                val = "; ".join(c[key]) if isinstance(c[key], list) else c[key]
                parts.append(f"<p><b>{label}:</b> {e(val)}</p>")
        parts.append("<ul>")
        for checker, ev in c["evidence"].items():
            parts.append(f"<li><b>{e(checker)}</b> ({e(ev['outcome'])}): {e(ev['summary'])}")
            steps = ev.get("details", {}).get("steps")
            if steps:
                parts.append("<ol>" + "".join(f"<li>{e(s)}</li>" for s in steps) + "</ol>")
            parts.append("</li>")
        parts.append("</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)
