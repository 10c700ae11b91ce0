"""Write an audit as ``report.json`` (deterministic for a seed), ``report.md``,
a self-contained ``report.html`` (plots embedded) and ``timings.json``."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

from ..audit.plots import FIGURE_TITLES
from ..audit.run import AuditReport
from .html import render as render_html
from .text import brief, nearest_text

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


def terminal_table(report: AuditReport, width: int = 140) -> str:
    """The verdict table: claim, verdict, source, per checker its evidence up to a clause boundary,
    then the corrected rule or the counterexample, wrapped at word boundaries to ``width`` columns
    (the report holds every word).  On a narrow terminal the source column gives way first."""
    id_w = max([28] + [len(r.claim.id) for r in report.results])
    src_w = min(34, max(18, width - id_w - 65))
    ev_w = max(24, width - id_w - 25 - src_w)
    lines = [f"{'claim':{id_w}s} {'verdict':22s} {'source':{src_w}s} evidence"]
    lines.append("-" * width)
    for (cid, source, verdict, ev), r in zip(table_rows(report), report.results):
        src = textwrap.wrap(source, src_w) or [""]
        if r.verdict.corrected_rule:  # what decides the verdict, after the checkers' lines
            ev = [*ev, f"⇒ corrected rule: {r.verdict.corrected_rule}"]
        elif r.verdict.counterexample:
            ev = [*ev, f"⇒ counterexample: {r.verdict.counterexample}"]
        if r.verdict.nearest:
            ev = [*ev, f"⇒ nearest true statement: {nearest_text(r.verdict.nearest)}"]
        wrapped = [
            w
            for e in ev or ["(no checker)"]
            for ws in [textwrap.wrap(brief(e, ev_w), ev_w, subsequent_indent="  ", break_long_words=True)]
            for w in ws
        ]
        for k in range(max(len(src), len(wrapped))):
            lead = f"{cid:{id_w}s} {verdict:22s}" if k == 0 else " " * (id_w + 23)
            left = src[k] if k < len(src) else ""
            lines.append(f"{lead} {left:{src_w}s} {wrapped[k] if k < len(wrapped) else ''}".rstrip())
    counts = report.to_json()["summary"]
    lines.append("")
    lines.append("verdicts: " + ", ".join(f"{v} {counts[v]}" for v in VERDICT_ORDER if v in counts))
    return "\n".join(lines)


def _md_cell(s: str) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def markdown(report: AuditReport, plot_names: Sequence[str] = ()) -> str:
    data = report.to_json()
    out = [
        "# gauge-audit report",
        "",
        f"Seed {report.seed}{' (full)' if report.full else ''}. Verdicts: "
        + ", ".join(f"{v} {n}" for v, n in data["summary"].items())
        + ".",
        "",
        "| claim | source | verdict | evidence |",
        "|---|---|---|---|",
    ]
    for cid, source, verdict, ev in table_rows(report):
        out.append(f"| `{cid}` | {_md_cell(source)} | **{verdict}** | {'<br>'.join(_md_cell(e) for e in ev)} |")
    out.append("")
    for n, name in enumerate(plot_names, 1):
        out += [
            f"![Figure {n}. {FIGURE_TITLES.get(name, name)}]({name})",
            "",
            f"*Figure {n}. {FIGURE_TITLES.get(name, name)}*",
            "",
        ]
    for section in _extra_sections(data.get("extras", {})):
        out += section + [""]
    out += ["## Claims", ""]
    for c in data["claims"]:
        out += [
            f"### `{c['id']}` — {c['verdict']}",
            "",
            f"*{c['document']}*, {c['location']} ({c['file']}:{c['line']})",
            "",
            f"> {c['statement']}",
            "",
        ]
        if c.get("rule"):
            out += [f"Rule: `{c['rule']}`", ""]
        out += [f"Verdict: **{c['verdict']}** — {c['why']}."]
        if c["conflicts"]:
            out += ["", "Conflicts: " + "; ".join(c["conflicts"])]
        if c["corrected_rule"]:
            out += ["", f"Corrected rule: {c['corrected_rule']}"]
        if c["counterexample"]:
            out += ["", f"Counterexample: {c['counterexample']}"]
        if c.get("nearest"):
            n = c["nearest"]
            out += ["", f"Nearest true statement: {nearest_text(n)}", "", f"As a rule: `{n['rule_text']}`"]
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
                    out.append(
                        f"    - {row['model']}: {row['verdict']}, max rel error {row['max_rel_error']:.3e} "
                        f"= {row['residual_eps']:.4g} ε (tol {_stat(row)}{row['tolerance_eps']:.4g} ε worst-case, "
                        f"κ {row['kappa']:.3g})"
                    )
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


def to_html(report: AuditReport, plots: dict[str, bytes]) -> str:
    return render_html(report.to_json(), plots)
