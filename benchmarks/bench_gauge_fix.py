"""Time gauge fixing: the two commands end to end on SmolLM2-135M (the real GGUF, 134.5 M
parameters), canonicalize and compare on MiniLM (22.6 M) and the tiny models, and the effect of
running the pipeline on one thread.

    bash scripts/with-venv.sh python benchmarks/bench_gauge_fix.py [--repeat 3] [--skip-smollm2]

Targets (issue 14): SmolLM2 ``gauge-audit canonicalize --model smollm2 --out DIR`` ≤ 60 s and
``gauge-audit compare smollm2 B --out DIR`` (B: a transformed float32 copy written by
``gauge-audit transform``) ≤ 120 s on 2 cores, each timed as the command a user runs (a fresh
process: reading the GGUF, the certificate, writing the files).  Ratios are from this one run;
nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import gauge_audit.gauge_fix.comparison as compare_mod
import gauge_audit.gauge_fix.pipeline as pipeline_mod
from gauge_audit.actions import ACTIONS
from gauge_audit.gauge_fix import canonicalize, compare
from gauge_audit.models import NAMED, build, smollm2
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


def command(argv: list[str]) -> tuple[float, str]:
    """Run ``gauge-audit ARGV`` in a fresh process; (wall seconds, last output line)."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "import sys; from gauge_audit.cli import main; sys.exit(main())", *argv],
                       capture_output=True, text=True)
    secs = time.perf_counter() - t
    if p.returncode not in (0, 1):
        raise SystemExit(f"gauge-audit {' '.join(argv)} failed: {p.stderr.strip()}")
    return secs, (p.stdout.strip().splitlines() or [""])[-1]


def bench_smollm2(repeat: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-gauge-fix-"))
    try:
        gguf = str(smollm2.path())
        t_b, _ = command(["transform", "--checkpoint", gguf, "--action", "composite", "--seed", "3", "--kappa", "4",
                          "--out", str(work / "B")])
        print(f"SmolLM2: transformed float32 copy B written by transform in {t_b:.1f} s (not part of the targets)")
        canon, cmp = [], []
        for i in range(repeat):
            t, line = command(["canonicalize", "--model", "smollm2", "--out", str(work / f"canon{i}")])
            canon.append(t)
            t, verdict = command(["compare", "smollm2", str(work / "B"), "--out", str(work / f"cmp{i}")])
            cmp.append(t)
        print(f"SmolLM2 canonicalize --out (target ≤ 60 s): {fmt(canon)}\n  {line}")
        print(f"SmolLM2 compare with B --out, 3 probes per model, element (target ≤ 120 s): {fmt(cmp)}")
        print(f"  ratio compare / canonicalize: {statistics.median(cmp) / statistics.median(canon):.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-smollm2", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, default threads {torch.get_num_threads()}")
    if not args.skip_smollm2:
        bench_smollm2(args.repeat)
    tiny = list(NAMED)
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
