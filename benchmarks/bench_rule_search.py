"""Time the symbolic rule checker on the rule claims that ship with the package (the catalog restated
as rules, the example paper, the nearest-statement examples), with the audit's per-claim search
budget, before and after: the checker of a baseline revision (default BASELINE: decisions at one
size, d_k = 2, no nearest-statement search) and the working tree's (two generic sizes, the nearest
true statement), each in its own process on one thread, in one run.  Prints the CPU seconds per
file, the slowest claim and the ratios, and per claim what each side concluded.

    bash scripts/with-venv.sh python benchmarks/bench_rule_search.py [--before REV] [--budget S]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "e117eaf"  # the last revision before the two-size check and the nearest-statement search
FILES = ("catalog_as_rules.toml", "example_paper.toml", "nearest_statements.toml")

# run in a child process whose gauge_audit is the side's tree (PYTHONPATH first); prints JSON rows
CHILD = r"""
import json, sys, time
from pathlib import Path
from gauge_audit.audit.rule_checks import rule_models
from gauge_audit.claims import load_file
from gauge_audit.models import config_of
from gauge_audit.rules import symbolic as rs
from gauge_audit.rules.budget import Budget
from gauge_audit.runtime import one_thread

budget, files = float(sys.argv[1]), sys.argv[2:]
rows = []
with one_thread():
    for f in files:
        _, claims = load_file(Path(f))
        for c in claims:
            if c.rule is None or "symbolic" not in c.checkers:
                continue
            cfgs = [config_of(m) for m in rule_models(c)[0]]
            t = time.process_time()
            try:
                r = rs.check(c.rule, cfgs, Budget(budget))
                near = getattr(r, "nearest", None)
                what = ("HOLDS" if r.verdict_holds else "FAILS") + (
                    f"; corrected {r.corrected_text}" if r.corrected_text else ""
                ) + (f"; nearest {near.statement()}" if near is not None else "") + (
                    f"; {r.condition}" if r.condition and near is None else ""
                )
            except Exception as exc:  # NOT-APPLICABLE at symbolic size: its message is the result
                what = f"{type(exc).__name__}: {exc}"
            rows.append({"file": Path(f).name, "claim": c.id, "seconds": time.process_time() - t, "result": what})
print(json.dumps(rows))
"""


def run_side(python_dir: Path, budget: float) -> list[dict]:
    files = [str(ROOT / "claims" / "examples" / f) for f in FILES]
    env = {**os.environ, "PYTHONPATH": str(python_dir), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(budget), *files], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BASELINE, help="the baseline revision (default %(default)s)")
    ap.add_argument("--budget", type=float, default=20.0, help="search budget per claim, CPU seconds (the audit's)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.before], check=True
        )
        try:
            before = run_side(tree / "python", args.budget)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    after = run_side(ROOT / "python", args.budget)
    print(
        f"symbolic rule checker, {len(after)} rule claims, search budget {args.budget:g} s per claim "
        f"(CPU seconds, one thread); before = {args.before}, after = working tree"
    )
    print(f"{'file':26s} {'claims':>6s} {'before':>9s} {'after':>9s} {'ratio':>6s} {'slowest after':>14s}")
    for f in FILES:
        b = [r for r in before if r["file"] == f]
        a = [r for r in after if r["file"] == f]
        tb, ta = sum(r["seconds"] for r in b), sum(r["seconds"] for r in a)
        slow = max(a, key=lambda r: r["seconds"])
        print(f"{f:26s} {len(a):6d} {tb:8.1f}s {ta:8.1f}s {ta / tb:5.2f}× {slow['seconds']:6.1f}s {slow['claim']}")
    tb, ta = sum(r["seconds"] for r in before), sum(r["seconds"] for r in after)
    print(f"{'all':26s} {len(after):6d} {tb:8.1f}s {ta:8.1f}s {ta / tb:5.2f}×")
    old = {(r["file"], r["claim"]): r["result"] for r in before}
    print("\nwhere the conclusions differ (before → after):")
    for r in after:
        was = old.get((r["file"], r["claim"]))
        if was != r["result"]:
            print(f"  {r['claim']}: {was}\n    → {r['result']}")


if __name__ == "__main__":
    main()
