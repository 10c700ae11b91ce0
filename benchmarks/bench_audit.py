"""Time the default audit and the --full audit of the built-in catalog (target for the
default: ≤ 60 s on 2 CPU cores), wall and CPU seconds (the worker processes' included), with the
time per checker, from one run — on the worker processes the CLI starts (one per usable core) and,
for the ratio, in this process alone (``--jobs 1``).  On a shared machine wall time is inflated by
other jobs: the CPU seconds are the comparable number.

    bash scripts/with-venv.sh python benchmarks/bench_audit.py [--no-full]
"""

from __future__ import annotations

import resource
import sys
import time

import torch

from gauge_audit.audit.checkers import Context
from gauge_audit.audit.parallel import default_jobs, plan
from gauge_audit.audit.plots import collect
from gauge_audit.audit.run import audit
from gauge_audit.claims import load_catalog


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the audit's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run(full: bool, jobs: int) -> tuple[float, dict]:
    from gauge_audit.precision.verdicts import certificate, study_for
    from gauge_audit.symbolic.norms import equivariance_dimension, ln_affine_rotation

    for memo in (study_for, certificate, equivariance_dimension, ln_affine_rotation):
        memo.cache_clear()  # each run pays for its own error study, certificates and derivations
    claims = list(load_catalog().values())
    t, cpu = time.perf_counter(), _cpu()
    ctx = Context(seed=0, full=full)
    report = audit(claims, ctx, progress=None, jobs=jobs)
    collect(ctx)
    total = time.perf_counter() - t
    by_checker = {"CPU": _cpu() - cpu}
    for key, sec in report.timings.items():
        # a checkpoint's checks run ahead as one unit of a worker ("unit gemma3"): torch's time
        name = key.split("/")[1] if "/" in key else "torch" if key.startswith("unit ") else None
        if name:
            by_checker[name] = by_checker.get(name, 0.0) + sec
    return total, by_checker


def main() -> None:
    claims = list(load_catalog().values())
    jobs = default_jobs(plan(claims), claims)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {jobs} worker process(es)")
    t_default, per = run(full=False, jobs=jobs)
    print(
        f"default audit: {t_default:.1f} s wall, {per.pop('CPU'):.1f} s CPU  (target 60 s: ratio {t_default / 60:.2f})  "
        + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(per.items()))
    )
    t_one, per = run(full=False, jobs=1)
    print(
        f"default audit, one process: {t_one:.1f} s wall, {per.pop('CPU'):.1f} s CPU  "
        f"(one process / {jobs} workers = {t_one / t_default:.2f})"
    )
    if "--no-full" not in sys.argv:
        t_full, per = run(full=True, jobs=jobs)
        print(
            f"--full audit (SymPy and torch warm in this process): {t_full:.1f} s wall, {per.pop('CPU'):.1f} s CPU  "
            f"(full / default = {t_full / t_default:.2f})  "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(per.items()))
        )


if __name__ == "__main__":
    main()
