"""Dense vs matrix-free nullity: both timings and their ratio from one run.

    python benchmarks/bench_nullity.py            # P ≈ 5 000 (both methods) and P ≈ 20 000 (matrix-free)
    python benchmarks/bench_nullity.py --quick    # a small configuration only
    python benchmarks/bench_nullity.py --skip-20k

Targets (issue 5): the matrix-free path agrees with the dense one, is ≥ 5× faster at
P ≈ 5 000, and handles P ≈ 20 000 within 120 s on 2 CPU cores.  Both methods run once on a
tiny configuration first, so that neither pays torch's one-time start-up in the timing.
"""

from __future__ import annotations

import argparse
import sys
import time

from gauge_audit.models import gpt2
from gauge_audit.nullity import analyze


def run(cfg, method, quiet=True):
    t = time.perf_counter()
    r = analyze(cfg, seed=0, method=method, quiet=quiet)
    return r, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-20k", action="store_true")
    a = ap.parse_args(argv)
    tiny = gpt2.config(d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, d_head=4, d_ff=8, n_ctx=5, vocab=11)
    run(tiny, "dense")
    run(tiny, "matrix-free")
    if a.quick:
        p5 = gpt2.config(d_model=8, n_layers=2, n_heads=2, n_kv_heads=2, d_head=4, d_ff=16, n_ctx=6, vocab=13)
    else:
        p5 = gpt2.config(d_model=16, n_layers=2, n_heads=4, n_kv_heads=4, d_head=4, d_ff=32, n_ctx=8, vocab=24)
    rd, td = run(p5, "dense")
    rm, tm = run(p5, "matrix-free")
    agree = (rd.measured_nullity, rd.unexplained) == (rm.measured_nullity, rm.unexplained)
    print(f"P = {rd.params}: dense {td:.1f} s (nullity {rd.measured_nullity}, gap {rd.gap_ratio:.2g}); "
          f"matrix-free {tm:.1f} s (nullity {rm.measured_nullity}, gap {rm.gap_ratio:.2g}); "
          f"speed-up ×{td / tm:.1f} (target ≥ 5); agree: {agree}")
    fmt = lambda t: ", ".join(f"{k} {v:.1f}" for k, v in t.items())  # noqa: E731
    print(f"  dense: {fmt(rd.timings)} s")
    print(f"  matrix-free: {fmt(rm.timings)} s; sketch {rm.extra['sketch_rows']} rows × "
          f"{rm.params - rm.extra['eliminated_coordinates']} coordinates, {rm.extra['low_directions']} low "
          f"direction(s) measured exactly, σ certified ≥ {rm.extra['sigma_min_complement']:.2e}")
    ok = agree
    if not (a.quick or a.skip_20k):
        p20 = gpt2.config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_head=8, d_ff=64, n_ctx=12, vocab=40)
        r2, t2 = run(p20, "matrix-free", quiet=False)
        print(f"P = {r2.params}: matrix-free {t2:.1f} s ({r2.extra['rounding_model']} rounding model; "
              f"nullity {r2.measured_nullity} = explained "
              f"{r2.explained}, unexplained {r2.unexplained}, gap {r2.gap_ratio:.2g}); within 120 s: {t2 <= 120}")
        print(f"  {fmt(r2.timings)} s; sketch {r2.extra['sketch_rows']} rows × "
              f"{r2.params - r2.extra['eliminated_coordinates']} coordinates, {r2.extra['low_directions']} low "
              f"direction(s) measured exactly")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
