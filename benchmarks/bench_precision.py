"""Time the high-precision checks (targets: ≤ 10 s each on 2 CPU cores):
the referee's concrete test (100 sequences × 4 tokens, three mpmath forwards at
dps 50) and one dps = 50 block check (qk-gl on the one-layer gpt2-tiny); plus, for
scale, the six certified counterexamples and the default error study.

    bash scripts/with-venv.sh python benchmarks/bench_precision.py
"""

from __future__ import annotations

import os
import time

import torch

from gauge_audit.precision import certify_all, check_action, referee_test, run_study

TARGET_S = 10.0


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    print(f"torch {torch.__version__}, CPU cores {os.cpu_count()}, torch threads {torch.get_num_threads()}")
    ref, t_ref = timed(lambda: referee_test(seed=0, dps=50))
    one, t_one = timed(lambda: check_action("qk-gl", dps=(50,)))
    three, t_three = timed(lambda: check_action("qk-gl", dps=(30, 50, 100)))
    certs, t_cert = timed(certify_all)
    study, t_study = timed(lambda: run_study(device="cpu"))
    print(
        f"referee test (100 × 4 tokens, dps 50):      {t_ref:6.2f} s   ratio to {TARGET_S:.0f} s target: "
        f"{t_ref / TARGET_S:.2f}   (paper max|Δy| {ref.paper_max_abs:.3g}, corrected {ref.corrected_rel:.1e})"
    )
    print(
        f"one dps=50 block check (qk-gl, gpt2-tiny):  {t_one:6.2f} s   ratio to {TARGET_S:.0f} s target: "
        f"{t_one / TARGET_S:.3f}   (residual {one.residuals[0].residual:.2e})"
    )
    print(
        f"qk-gl at dps 30/50/100:                     {t_three:6.2f} s   ratio (30/50/100 run) / (dps-50 run): "
        f"{t_three / t_one:.2f}"
    )
    print(
        f"six certified counterexamples (iv, dps 30): {t_cert:6.2f} s   (all exclude 0: "
        f"{all(c.excludes_zero for c in certs)})"
    )
    print(f"default error study (84 torch checks + 12 MiniLM): {t_study:6.2f} s")


if __name__ == "__main__":
    main()
