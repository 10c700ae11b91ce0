"""``gauge-audit barrier A B [--align] --data FILE``: the held-out loss along the straight path
from A to B′ and its barrier (see :mod:`gauge_audit.merge.loss`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import GaugeAuditError
from ..progress import echo, ticker
from .merge import add_pair_options, describe_alignment, pair_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "barrier",
        help="loss barrier on the straight path between two models (linear mode connectivity)",
        description="Evaluate the mean token cross-entropy of (1 − t)·A + t·B′ at evenly spaced t on "
        "held-out text and print the barrier max_t [L(t) − ((1 − t)·L(0) + t·L(1))].  --data is a "
        ".npy file of token ids (any tokeniser; rows read in order) or a text file tokenised at the byte level "
        "(the models of benchmarks/train_models.py).",
    )
    add_pair_options(p)
    p.add_argument("--data", required=True, metavar="FILE", help="held-out text or .npy of token ids")
    p.add_argument("--points", type=int, default=11, help="points on the path, both ends included")
    p.add_argument("--context", type=int, help="tokens per window (default: min(n_ctx, 128))")
    p.add_argument("--windows", type=int, default=64, help="windows evaluated, spread evenly over the file")
    p.add_argument("--plot", metavar="PNG", help="draw the curve to this PNG file")
    p.add_argument("--json", action="store_true", help="print the curve as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..merge.loss import barrier_curve, load_tokens, path_points, windows
    from ..models.checkpoint import open_checkpoint

    ts = path_points(args.points)
    if args.windows < 1:
        raise GaugeAuditError("--windows must be at least 1")
    cfg = open_checkpoint(args.a).cfg
    context = args.context if args.context is not None else min(cfg.n_ctx, 128)
    if not 1 <= context <= cfg.n_ctx:
        raise GaugeAuditError(f"--context must lie in [1, {cfg.n_ctx}] (the model's context)")
    win = windows(load_tokens(args.data, cfg), context, args.windows)  # bad data fails before alignment
    pair = pair_from_args(args)
    curve = barrier_curve(pair.cfg, pair.params_a, pair.params_b, win, ts, progress=ticker("path", unit="point"))
    if args.plot:
        from ..merge.plot import plot_curves

        label = "aligned (" + pair.aligned["group"] + ")" if pair.aligned else "vanilla"
        plot_curves({label: curve}, args.plot, subtitle=f"A = {Path(args.a).name}, B = {Path(args.b).name}")
    result = {
        **curve.to_json(),
        "a": str(args.a),
        "b": str(args.b),
        "tokens": int(win.shape[0] * (win.shape[1] - 1)),
        "windows": int(win.shape[0]),
        "context": context,
        "distance_before": pair.distance_before,
        "distance": pair.distance,
        "alignment": pair.aligned,
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    echo(describe_alignment(pair))
    print(f"loss along (1 − t)·A + t·B′ on {result['tokens']:,} held-out tokens ({result['windows']} × {context}):")
    for t, lt, ex in zip(curve.ts, curve.losses, curve.excess):
        print(f"  t = {t:.2f}   L = {lt:.4f}   L − chord = {ex:+.4f}")
    print(f"barrier: {curve.barrier:.4f} nats at t = {curve.t_max:.2f}")
    if args.plot:
        print(f"wrote {args.plot}")
    return 0
