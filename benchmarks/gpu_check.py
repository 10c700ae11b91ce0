"""The GPU path in one call: SmolLM2 checks in float64, float32 and bfloat16 on the CUDA device,
the P ≈ 20 000 matrix-free nullity certificate, and canonicalize / compare on SmolLM2 — one table
(step, dtype, device, time, residual against tolerance) within a time budget.

    python benchmarks/gpu_check.py                  # on a CUDA machine (≤ 10 minutes)
    python benchmarks/gpu_check.py --quick          # a smoke run of every step at tiny sizes (CPU or CUDA)
    python benchmarks/gpu_check.py --device cpu     # the full run on the CPU

Without a CUDA device the script says so and runs the --quick path on the CPU (or the full run
with ``--device cpu``).  The nullity certificate and gauge fixing compute in float64 on the CPU
by design (the device column says where each step ran); the checks run the model on the device.
Each step is timed as the library call a command makes (SmolLM2 read once, outside the rows'
times); the budget is checked before each step, and what it leaves out is listed as skipped.
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from gauge_audit.actions import ACTIONS
from gauge_audit.cli.canonicalize import load_source
from gauge_audit.gauge_fix import canonicalize, compare, function_check
from gauge_audit.models import build, config_of, gpt2
from gauge_audit.nullity import analyze
from gauge_audit.nullity.cost import parameter_count
from gauge_audit.numeric import check
from gauge_audit.runtime import generator, model_threads

DTYPES = ("float64", "float32", "bfloat16")
# bench_nullity.py's configurations: P ≈ 20 000 (the README's certificate) and a tiny one.
P20K = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_head=8, d_ff=64, n_ctx=12, vocab=40)
P_TINY = dict(d_model=8, n_layers=2, n_heads=2, n_kv_heads=2, d_head=4, d_ff=16, n_ctx=6, vocab=13)


@dataclass
class Row:
    step: str
    dtype: str
    device: str
    seconds: float | None
    result: str


class Table:
    """Rows printed as they finish (a run cut short still shows what it measured) and once more,
    aligned, at the end."""

    def __init__(self, budget_s: float):
        self.rows: list[Row] = []
        self.t0 = time.perf_counter()
        self.budget_s = budget_s

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        t = "-" if row.seconds is None else f"{row.seconds:.2f} s"
        print(f"  {row.step} [{row.dtype}, {row.device}] {t}: {row.result}", flush=True)

    def print(self) -> None:
        head = ("step", "dtype", "device", "time", "residual / tolerance")
        body = [
            (r.step, r.dtype, r.device, "-" if r.seconds is None else f"{r.seconds:.2f} s", r.result) for r in self.rows
        ]
        w = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
        print()
        for line in [head, tuple("-" * n for n in w) + ("-" * 20,), *body]:
            print("  ".join(f"{c:{w[i]}s}" if i < 4 else c for i, c in enumerate(line)))
        print(f"\ntotal {time.perf_counter() - self.t0:.1f} s of a {self.budget_s:.0f} s budget")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


def step_checks(table: Table, model_name: str, device: torch.device, min_left: float) -> None:
    """Every action that applies to the model, in each dtype, run on ``device``."""
    t_load = time.perf_counter()
    model = build(model_name, seed=0, device=str(device))
    print(f"{model_name}: built on {device} in {time.perf_counter() - t_load:.1f} s", flush=True)
    actions = [a.name for a in ACTIONS.values() if a.applies(config_of(model_name)) is None]
    for dtype in DTYPES:
        for a in actions:
            if table.left() < min_left:
                table.add(Row(f"check {model_name} {a}", dtype, str(device), None, "skipped: budget spent"))
                continue
            with model_threads(parameter_count(model.cfg)):  # the CPU path: as `gauge-audit check` chooses
                r, secs = timed(lambda m=model, a=a, dtype=dtype: check(m, a, seed=0, dtype=dtype), device)
            note = "" if r.agrees else "  <-- differs from theory"
            table.add(
                Row(
                    f"check {model_name} {a}",
                    dtype,
                    str(device),
                    secs,
                    f"{r.residual_eps:.3g} ε vs {r.tolerance_statistical_eps:.4g} ε statistical, "
                    f"{r.tolerance_eps:.4g} ε worst case: {r.verdict}{note}",
                )
            )
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def step_nullity(table: Table, dims: dict, min_left: float) -> None:
    cfg = gpt2.config(**dims)
    label = "nullity certificate (matrix-free)"
    if table.left() < min_left:
        table.add(Row(label, "float64", "cpu", None, "skipped: budget spent"))
        return
    r, secs = timed(lambda: analyze(cfg, seed=0, method="matrix-free", quiet=True), torch.device("cpu"))
    x = r.extra
    table.add(
        Row(
            f"{label} P = {r.params}",
            "float64",
            "cpu",
            secs,
            f"nullity {r.measured_nullity} = explained {r.explained} (unexplained {r.unexplained}); gap "
            f"{r.gap_ratio:.3g}; σ certified ≥ {x['sigma_min_complement']:.3g}; Gram {x['gram_seconds']:.1f} s, "
            f"Cholesky {x['cholesky_seconds']:.1f} s",
        )
    )


def step_gauge_fix(table: Table, model_name: str, min_left: float) -> None:
    """canonicalize (with its function check) and compare against a transformed float32 copy."""
    if table.left() < min_left:
        for s in ("canonicalize", "compare"):
            table.add(Row(f"{s} {model_name}", "float64", "cpu", None, "skipped: budget spent"))
        return
    src = load_source(model_name)
    cpu = torch.device("cpu")
    canon, secs = timed(lambda: canonicalize(src.cfg, src.params, storage_dtype=src.storage_dtype), cpu)
    fn = function_check(src.cfg, src.params, canon.params, canon.rounding_kappa, element=canon.element())
    table.add(
        Row(
            f"canonicalize {model_name}",
            str(src.storage_dtype).replace("torch.", ""),
            "cpu",
            secs,
            f"{fn['residual_eps']:.3g} ε vs {fn['tolerance_statistical_eps']:.4g} ε statistical, "
            f"{fn['tolerance_eps']:.4g} ε worst case: {fn['verdict']}",
        )
    )
    if table.left() < min_left:
        table.add(Row(f"compare {model_name}", "float32", "cpu", None, "skipped: budget spent"))
        return
    act = ACTIONS["composite"]
    b = act.apply(src.cfg, src.params, act.sample(src.cfg, src.params, generator(3), 4.0))
    b32 = {k: v.to(torch.float32) for k, v in b.items()}
    res, secs = timed(lambda: compare(src.cfg, src.params, src.cfg, b32, storage_dtype_a=src.storage_dtype), cpu)
    table.add(
        Row(
            f"compare {model_name} with g·A in float32",
            "float32",
            "cpu",
            secs,
            f"invariant distance {res.invariant_distance:.3g} vs tolerance {res.tolerance:.3g}: {res.verdict}",
        )
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="every step at tiny sizes (a smoke run)")
    ap.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the checks run (auto: CUDA when visible; else the --quick path on the CPU)",
    )
    ap.add_argument("--budget-minutes", type=float, default=10.0, help="no step starts after this")
    a = ap.parse_args(argv)
    has_cuda = torch.cuda.is_available()
    if a.device == "cuda" and not has_cuda:
        print("no CUDA device (--device cuda)", file=sys.stderr)
        return 2
    if a.device == "auto" and not has_cuda:
        if not a.quick:
            print("no CUDA device: running the --quick path on the CPU (--device cpu for the full run there)")
        a.quick = True
    device = torch.device("cuda" if a.device != "cpu" and has_cuda else "cpu")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"torch {torch.__version__}, {where}, CPU threads {torch.get_num_threads()}; "
        f"{'quick (tiny sizes)' if a.quick else 'full'} run, budget {a.budget_minutes:g} min",
        flush=True,
    )
    table = Table(60.0 * a.budget_minutes)
    model = "llama-tiny-gqa" if a.quick else "smollm2"
    step_checks(table, model, device, min_left=5.0)
    step_nullity(table, P_TINY if a.quick else P20K, min_left=5.0 if a.quick else 120.0)
    step_gauge_fix(table, model, min_left=5.0 if a.quick else 60.0)
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
