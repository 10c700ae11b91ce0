"""Time the symbolic rule checker's correction search on the rule claims that ship with the package
(the catalog restated as rules, the example paper), with no time budget, two ways: residuals affine
in the unknowns evaluated as exact coefficient rows (the default) and every residual substituted
and expanded by SymPy (the general path).  Both must give the same derivation, field by field.

    bash scripts/with-venv.sh python benchmarks/bench_rule_search.py
"""

from __future__ import annotations

import json
import time

from gauge_audit.audit.rule_checks import rule_models
from gauge_audit.claims import CATALOG_DIR, load_file
from gauge_audit.models import config_of
from gauge_audit.rules import solve
from gauge_audit.rules import symbolic as rs
from gauge_audit.runtime import one_thread

FILES = ("catalog_as_rules.toml", "example_paper.toml")


def derivations() -> list[str]:
    out = []
    for name in FILES:
        _, claims = load_file(CATALOG_DIR / "examples" / name)
        for c in claims:
            if c.rule is None or "symbolic" not in c.checkers:
                continue
            cfgs = [config_of(m) for m in rule_models(c)[0]]
            try:
                out.append(json.dumps(rs.check(c.rule, cfgs).to_json(), sort_keys=True, default=str))
            except Exception as exc:  # a rule NOT-APPLICABLE at symbolic size: its message is the result
                out.append(f"{type(exc).__name__}: {exc}")
    return out


def timed() -> tuple[list[str], float]:
    t = time.process_time()
    out = derivations()
    return out, time.process_time() - t


def main() -> None:
    with one_thread():
        fast, t_fast = timed()
        affine = solve._compile_affine
        solve._compile_affine = lambda *a: None  # every residual through substitute-and-expand
        try:
            general, t_general = timed()
        finally:
            solve._compile_affine = affine
    same = fast == general
    print(f"{len(fast)} rule claims, symbolic checker with no time budget (CPU seconds, one thread)")
    print(f"  coefficient rows for affine residuals: {t_fast:7.2f} s")
    print(f"  substitute and expand every residual:  {t_general:7.2f} s")
    print(f"  ratio: {t_general / t_fast:.2f}×   derivations identical: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
