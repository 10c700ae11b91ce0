"""Time gauge fixing: canonicalize and compare on MiniLM (real weights, 22.6 M parameters) and the
tiny models, and the effect of running the pipeline on one thread.

    bash scripts/with-venv.sh python benchmarks/bench_gauge_fix.py [--repeat 3]

Targets (issue 14, with checkpoints): SmolLM2-135M canonicalize ≤ 60 s, compare two copies
≤ 120 s on 2 cores — measured once the checkpoint loader exists; MiniLM is the stand-in here.
Ratios are from this one run; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import gauge_audit.gauge_fix.comparison as compare_mod
import gauge_audit.gauge_fix.pipeline as pipeline_mod
from gauge_audit.actions import ACTIONS
from gauge_audit.gauge_fix import canonicalize, compare
from gauge_audit.models import build, model_names
from gauge_audit.runtime import generator


def timed(fn, repeat: int) -> tuple[object, list[float]]:
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, times


@contextlib.contextmanager
def default_threads():
    """Run the pipeline with torch's default thread count (its runtime.one_thread() disabled)."""
    saved = pipeline_mod.one_thread, compare_mod.one_thread
    pipeline_mod.one_thread = compare_mod.one_thread = contextlib.nullcontext
    try:
        yield
    finally:
        pipeline_mod.one_thread, compare_mod.one_thread = saved


def fmt(ts: list[float]) -> str:
    return f"{statistics.median(ts):.2f} s (min {min(ts):.2f}, max {max(ts):.2f}, n={len(ts)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, default threads {torch.get_num_threads()}")
    tiny = [m for m in model_names() if m != "minilm"]
    models = {m: build(m, device="cpu") for m in tiny}
    _, t_tiny = timed(lambda: [canonicalize(m.cfg, m.params) for m in models.values()], args.repeat)
    print(f"canonicalize all {len(tiny)} tiny models: {fmt(t_tiny)}")

    t = time.perf_counter()
    mini = build("minilm", device="cpu")
    print(f"MiniLM load: {time.perf_counter() - t:.2f} s")
    _, t_canon = timed(lambda: canonicalize(mini.cfg, mini.params), args.repeat)
    with default_threads():
        _, t_canon_mt = timed(lambda: canonicalize(mini.cfg, mini.params), args.repeat)
    print(f"MiniLM canonicalize, one thread:      {fmt(t_canon)}")
    print(f"MiniLM canonicalize, default threads: {fmt(t_canon_mt)}   "
          f"(ratio default/one thread {statistics.median(t_canon_mt) / statistics.median(t_canon):.2f})")

    act = ACTIONS["composite"]
    b = act.apply(mini.cfg, mini.params, act.sample(mini.cfg, mini.params, generator(1), 4.0))
    b16 = {k: v.to(torch.bfloat16) for k, v in b.items()}
    r, t_cmp = timed(lambda: compare(mini.cfg, mini.params, mini.cfg, b16), args.repeat)
    print(f"MiniLM compare with a transformed bfloat16 copy (3 probes per model, element): {fmt(t_cmp)} "
          f"→ {r.verdict}, invariant {r.invariant_distance:.2e} ≤ {r.tolerance:.2e}")
    _, t_cmp1 = timed(lambda: compare(mini.cfg, mini.params, mini.cfg, b16, probes=1, with_element=False), args.repeat)
    print(f"MiniLM compare, 1 probe per model, no element: {fmt(t_cmp1)}")
    print(f"ratio compare / canonicalize: {statistics.median(t_cmp) / statistics.median(t_canon):.1f} "
          f"(2 canonicalisations + 2×3 probes + element)")


if __name__ == "__main__":
    main()
