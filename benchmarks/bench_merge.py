"""Linear mode connectivity of models trained here from different seeds, before and after
aligning B to A within growing parts of its gauge group — next to the published GLMC numbers.

    python benchmarks/bench_merge.py --cache ~/.cache/gauge-audit/merge-models

For each architecture (GPT-2-style: LayerNorm, learned positions; LLaMA-style: RMSNorm, RoPE,
GQA) the pair is seed 0 (A) and seed 1 (B) of benchmarks/train_models.py (trained first if
missing).  Rows: vanilla averaging; weight matching with permutations only (Git Re-Basin's
group); + one orthogonal map per head (Zhang et al.'s group); the full gauge group; and
activation matching (full group) on training text.  Columns: ‖A − B′‖/‖A‖; the loss barrier
max_t [L(t) − chord] over 11 points on held-out plays; the excess at the midpoint; the ratio
barrier / vanilla barrier (comparable across models and corpora); and L(B′) − L(B), which is 0
up to rounding when the alignment kept B's function.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from gauge_audit.merge import align_pair, barrier_curve, open_pair
from gauge_audit.merge.loss import BarrierCurve, path_points, windows
from gauge_audit.merge.plot import plot_curves
from gauge_audit.training import corpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_models import ensure, model_dir  # noqa: E402

# Theus et al., "Generalized Linear Mode Connectivity for Transformers" (NeurIPS 2025): loss
# barrier of the merged midpoint, GPT-2.  (vanilla, weight matching, learned matching)
GLMC = {
    "GPT-2 / TinyShakespeare": (2.02, 0.34, 0.02),
    "GPT-2 / BookCorpus": (4.34, 1.56, 0.42),
}
VARIANTS = (
    ("vanilla averaging", None, False),
    ("permutations (weight matching)", "permutation", False),
    ("+ per-head orthogonal (weight matching)", "orthogonal", False),
    ("full group (weight matching)", "full", False),
    ("full group (activation matching)", "full", True),
)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    recs = ensure(args.cache)
    held = corpus.tokens("heldout")
    train = corpus.tokens("train")
    ts = path_points(args.points)
    results = {}
    for arch in ("gpt2", "llama"):
        a, b = model_dir(args.cache, arch, 0), model_dir(args.cache, arch, 1)
        base = open_pair(a, b)
        ctx = min(base.cfg.n_ctx, 128)
        win = windows(held, ctx, args.windows)
        match = windows(train, ctx, max(1, args.match_tokens // ctx))[:, :-1]
        rows, vanilla = [], None
        for label, group, act in VARIANTS:
            t0 = time.process_time()
            pair = (
                base
                if group is None
                else align_pair(base, group, data=match if act else None, seed=0, max_seconds=args.max_seconds)
            )
            t_align = time.process_time() - t0
            curve = barrier_curve(pair.cfg, pair.params_a, pair.params_b, win, ts)
            if vanilla is None:
                vanilla = curve
            mid = curve.excess[ts.index(0.5)] if 0.5 in ts else float("nan")
            rows.append(
                {
                    "variant": label,
                    "distance": pair.distance,
                    "barrier": curve.barrier,
                    "midpoint_excess": mid,
                    "ratio": curve.barrier / vanilla.barrier if vanilla.barrier > 0 else float("nan"),
                    "loss_B_change": curve.losses[-1] - vanilla.losses[-1],
                    "align_cpu_s": t_align,
                    "curve": curve.to_json(),
                    "stages": pair.aligned["stages"] if pair.aligned else None,
                    "stopped": pair.aligned["stopped"] if pair.aligned else None,
                }
            )
            print(
                f"  {arch} {label}: barrier {curve.barrier:.4f} distance {pair.distance:.4f} "
                f"({t_align:.0f} CPU-s align, stopped by {pair.aligned['stopped'] if pair.aligned else '-'})",
                file=sys.stderr,
                flush=True,
            )
        if args.plot_dir:
            args.plot_dir.mkdir(parents=True, exist_ok=True)
            curves = {row["variant"]: BarrierCurve(row["curve"]["t"], row["curve"]["loss"]) for row in rows}
            plot_curves(curves, args.plot_dir / f"merge_{arch}.png", subtitle=f"{arch}: seed 0 (A) and seed 1 (B)")
        results[arch] = {
            "L_A": vanilla.losses[0],
            "L_B": vanilla.losses[-1],
            "params": sum(v.numel() for v in base.params_a.values()),
            "training": {s: recs[arch, s] for s in (0, 1)},
            "rows": rows,
        }
    return results


def table(results: dict, args) -> str:
    out = [
        "| model pair | method | ‖A − B′‖/‖A‖ | barrier (max over t) | excess at t = ½ | barrier / vanilla "
        "| L(B′) − L(B) |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"gpt2": "GPT-2-style (LayerNorm, learned pos.)", "llama": "LLaMA-style (RMSNorm, RoPE, GQA)"}
    for arch, r in results.items():
        for row in r["rows"]:
            out.append(
                f"| {names[arch]}, L(A) = {r['L_A']:.3f}, L(B) = {r['L_B']:.3f} | {row['variant']} | "
                f"{row['distance']:.4f} | {row['barrier']:.4f} | {row['midpoint_excess']:.4f} | "
                f"{row['ratio']:.3f} | {row['loss_B_change']:+.1e} |"
            )
    for name, (v, wm, lm) in GLMC.items():
        for label, x in (("vanilla averaging", v), ("weight matching (GLMC)", wm), ("learned matching (GLMC)", lm)):
            out.append(
                f"| {name} (Theus et al. 2025, published) | {label} | – | {x:.2f} (midpoint) | – | {x / v:.3f} | – |"
            )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, type=Path, help="directory of the trained models")
    ap.add_argument("--points", type=int, default=11, help="points on each path, ends included")
    ap.add_argument("--windows", type=int, default=32, help="held-out windows of 128 bytes per point")
    ap.add_argument("--match-tokens", type=int, default=4096, help="training tokens for activation matching")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="time budget (wall) of each alignment")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the result does not depend on it)")
    ap.add_argument("--plot-dir", type=Path, help="draw each pair's curves to DIR/merge_<arch>.png")
    ap.add_argument("--json-out", type=Path, help="also write every number (and each curve) as JSON")
    args = ap.parse_args(argv)
    t0, w0 = time.process_time(), time.perf_counter()
    try:
        results = run(args)
    except FileNotFoundError as exc:
        print(f"bench_merge: {exc}", file=sys.stderr)
        return 2
    print(table(results, args))
    print(
        f"\n{args.points} points per path, {args.windows} × 128 held-out bytes per point; alignment budget "
        f"{args.max_seconds:g} s each; {time.process_time() - t0:.0f} CPU-s, {time.perf_counter() - w0:.0f} s wall "
        f"({platform.machine()}, {torch.get_num_threads()} thread(s), torch {torch.__version__})"
    )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
