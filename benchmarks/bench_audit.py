"""Time the default audit and the --full audit of the built-in catalog (target for the
default: ≤ 60 s on 2 CPU cores), wall and CPU seconds, with the time per checker, from one run.
On a shared machine wall time is inflated by other jobs: the CPU seconds are the comparable number.

    bash scripts/with-venv.sh python benchmarks/bench_audit.py [--no-full]
"""

from __future__ import annotations

import sys
import time

import torch

from gauge_audit.audit.checkers import Context
from gauge_audit.audit.plots import collect
from gauge_audit.audit.run import audit
from gauge_audit.claims import load_catalog


def run(full: bool) -> tuple[float, dict]:
    from gauge_audit.precision.verdicts import certificate, study_for
    from gauge_audit.symbolic.norms import equivariance_dimension, ln_affine_rotation

    for memo in (study_for, certificate, equivariance_dimension, ln_affine_rotation):
        memo.cache_clear()  # each run pays for its own error study, certificates and derivations
    claims = list(load_catalog().values())
    t, cpu = time.perf_counter(), time.process_time()
    ctx = Context(seed=0, full=full)
    report = audit(claims, ctx, progress=None)
    collect(ctx)
    total = time.perf_counter() - t
    by_checker = {"CPU": time.process_time() - cpu}
    for key, sec in report.timings.items():
        if "/" in key:
            by_checker[key.split("/")[1]] = by_checker.get(key.split("/")[1], 0.0) + sec
    return total, by_checker


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    t_default, per = run(full=False)
    print(
        f"default audit: {t_default:.1f} s wall, {per.pop('CPU'):.1f} s CPU  (target 60 s: ratio {t_default / 60:.2f})  "
        + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(per.items()))
    )
    if "--no-full" not in sys.argv:
        t_full, per = run(full=True)
        print(
            f"--full audit (same process: SymPy and torch warm): {t_full:.1f} s wall, {per.pop('CPU'):.1f} s CPU  "
            f"(full / default = {t_full / t_default:.2f})  "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(per.items()))
        )


if __name__ == "__main__":
    main()
