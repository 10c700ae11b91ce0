"""Time gauge fixing: the two commands end to end on SmolLM2-135M (the real GGUF, 134.5 M
parameters), canonicalize and compare on MiniLM (22.6 M) and the tiny models, and the effect of
running the pipeline on one thread.

    bash scripts/with-venv.sh python benchmarks/bench_gauge_fix.py [--repeat 3] [--skip-smollm2]

Targets: SmolLM2 ``gauge-audit canonicalize --model smollm2 --out DIR`` ≤ 15 s and ≤ 1.5 GB peak
resident memory, ``gauge-audit compare smollm2 B --out DIR`` (B: a transformed float32 copy
written by ``gauge-audit transform``) ≤ 30 s and ≤ 2 GB, on 2 cores, each timed as the command a
user runs (a fresh process: reading the GGUF, the certificate, writing the files); printed with
the child's CPU seconds (user + sys, less sensitive to a shared machine's load) and the load
average.  ``--old-path`` also times compare's rounding probes against their plain definition
(each probe through ``canonicalize`` with the whole-model rules) on SmolLM2 and prints both
tolerances.  Ratios are from this one run; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
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


LAST: dict = {}


def command(argv: list[str]) -> tuple[float, str]:
    """Run ``gauge-audit ARGV`` in a fresh process; (wall seconds, last output line).  Its CPU
    seconds (user + sys), peak resident memory and the load average are left in LAST."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, "-c", "import sys; from gauge_audit.cli import main; sys.exit(main())", *argv],
            stdout=out,
            stderr=err,
            text=True,
        )
        _, status, usage = os.wait4(p.pid, 0)  # the child's own rusage (not the maximum over all children)
        secs = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    if p.returncode not in (0, 1):
        raise SystemExit(f"gauge-audit {' '.join(argv)} failed: {errors.strip()}")
    LAST.clear()
    LAST.update(load=os.getloadavg()[0], cpu=usage.ru_utime + usage.ru_stime, rss_gb=usage.ru_maxrss / 2**20)
    return secs, (text.strip().splitlines() or [""])[-1]


def usage() -> str:
    return f"CPU {LAST['cpu']:.1f} s, peak RSS {LAST['rss_gb']:.2f} GiB, load {LAST['load']:.1f}"


def bench_smollm2(repeat: int, old_path: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-gauge-fix-"))
    try:
        gguf = str(smollm2.path())
        t_b, _ = command(
            [
                "transform",
                "--checkpoint",
                gguf,
                "--action",
                "composite",
                "--seed",
                "3",
                "--kappa",
                "4",
                "--out",
                str(work / "B"),
            ]
        )
        print(f"SmolLM2: transformed float32 copy B written by transform in {t_b:.1f} s (not part of the targets)")
        canon, cmp = [], []
        for i in range(repeat):
            t, line = command(["canonicalize", "--model", "smollm2", "--out", str(work / f"canon{i}")])
            canon.append(t)
            print(f"  canonicalize #{i}: {t:.1f} s wall, {usage()}")
            t, verdict = command(["compare", "smollm2", str(work / "B"), "--out", str(work / f"cmp{i}")])
            cmp.append(t)
            print(f"  compare #{i}: {t:.1f} s wall, {usage()}")
        print(f"SmolLM2 canonicalize --out (target ≤ 15 s, ≤ 1.5 GB): {fmt(canon)}\n  {line}")
        print(f"SmolLM2 compare with B --out, 3 probes per model, element (target ≤ 30 s, ≤ 2 GB): {fmt(cmp)}")
        print(f"  ratio compare / canonicalize: {statistics.median(cmp) / statistics.median(canon):.2f}")
        if old_path:
            probes_against_plain(work / "B")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def probes_against_plain(b_dir: Path) -> None:
    """compare's rounding response of SmolLM2 and of B against its plain definition: time and the
    tolerance λ·√(σ_A² + σ_B²) of every group from each."""
    import math

    from gauge_audit.cli.canonicalize import load_source
    from gauge_audit.gauge_fix.comparison import (
        FAILURE_PROBABILITY,
        _sq_by_group,
        rounding_response,
        rounding_response_recanonicalised,
    )

    a = load_source("smollm2", native=True)
    b = load_source(str(b_dir), native=True)
    ca = canonicalize(a.cfg, a.params, storage_dtype=a.storage_dtype)
    cb = canonicalize(b.cfg, b.params, reference=ca.params, storage_dtype=b.storage_dtype)
    den = _sq_by_group(ca.params)
    lam = math.sqrt(2.0 * math.log(2.0 * (len(den) + 1) / FAILURE_PROBABILITY))
    tols = {}
    for label, fn in (("fast", rounding_response), ("plain", rounding_response_recanonicalised)):
        t = time.perf_counter()
        ra = fn(a.cfg, a.params, ca, ca.params, 3, 0)
        rb = fn(b.cfg, b.params, cb, ca.params, 3, 1)
        secs = time.perf_counter() - t
        tols[label] = {g: lam * math.sqrt((ra.get(g, 0.0) + rb.get(g, 0.0)) / (den[g] or 1.0)) for g in den}
        print(f"SmolLM2 probes ({label}): 2×3 probes in {secs:.1f} s")
    for g in den:
        f, p = tols["fast"][g], tols["plain"][g]
        print(f"  {g:14s} tolerance fast {f:.4e}  plain {p:.4e}  factor {f / p if p else float('nan'):.6f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--old-path", action="store_true", help="also time the probes' plain definition on SmolLM2")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, default threads {torch.get_num_threads()}")
    if not args.skip_smollm2:
        bench_smollm2(args.repeat, args.old_path)
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
    print(
        f"MiniLM canonicalize, default threads: {fmt(t_canon_mt)}   "
        f"(ratio default/one thread {statistics.median(t_canon_mt) / statistics.median(t_canon):.2f})"
    )

    act = ACTIONS["composite"]
    b = act.apply(mini.cfg, mini.params, act.sample(mini.cfg, mini.params, generator(1), 4.0))
    b16 = {k: v.to(torch.bfloat16) for k, v in b.items()}
    r, t_cmp = timed(lambda: compare(mini.cfg, mini.params, mini.cfg, b16), args.repeat)
    print(
        f"MiniLM compare with a transformed bfloat16 copy (3 probes per model, element): {fmt(t_cmp)} "
        f"→ {r.verdict}, invariant {r.invariant_distance:.2e} ≤ {r.tolerance:.2e}"
    )
    _, t_cmp1 = timed(lambda: compare(mini.cfg, mini.params, mini.cfg, b16, probes=1, with_element=False), args.repeat)
    print(f"MiniLM compare, 1 probe per model, no element: {fmt(t_cmp1)}")
    print(
        f"ratio compare / canonicalize: {statistics.median(t_cmp) / statistics.median(t_canon):.1f} "
        f"(2 canonicalisations + 2×3 probes + element)"
    )


if __name__ == "__main__":
    main()
