"""``gauge-audit merge A B --alpha 0.5 [--align] --out DIR``: the checkpoint (1 − α)·A + α·B′,
B′ = B, or with ``--align`` B′ = g·B for the element g of B's gauge group that
:mod:`gauge_audit.align` finds to bring B close to A.  Also the options both ``merge`` and
``barrier`` take to read and align the pair."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import GaugeAuditError
from ..progress import echo, note
from ..runtime import resolve_dtype


def add_pair_options(p, a_help: str = "checkpoint A (HF directory or llama GGUF)") -> None:
    p.add_argument("a", metavar="A", help=a_help)
    p.add_argument("b", metavar="B", help="checkpoint B of the same architecture and shape")
    p.add_argument("--align", action="store_true", help="align B to A within B's gauge group first")
    p.add_argument(
        "--group",
        choices=("permutation", "orthogonal", "full"),
        default="full",
        help="with --align: permutations only (Git Re-Basin); + per-head orthogonal maps (Zhang et al.); "
        "or the model's full gauge group",
    )
    p.add_argument(
        "--match-data",
        metavar="FILE",
        help="with --align: match activations on this text / .npy of token ids instead of weights",
    )
    p.add_argument("--match-tokens", type=int, default=4096, help="tokens of --match-data used for matching")
    p.add_argument("--seed", type=int, default=0, help="seed of the alignment's random choices")
    p.add_argument("--max-seconds", type=float, default=120.0, help="time budget of the alignment")


def pair_from_args(args):
    """Open A and B and align B as the options say (one line on stderr per stage)."""
    from ..merge import open_pair
    from ..merge.loss import load_tokens
    from ..models.checkpoint import open_checkpoint
    from ..training.corpus import token_rows

    if not (args.max_seconds > 0 and math.isfinite(args.max_seconds)):
        raise GaugeAuditError("--max-seconds must be a positive number")
    if (args.match_data is not None or args.group != "full") and not args.align:
        raise GaugeAuditError("--group and --match-data need --align")
    data = None
    if args.match_data is not None:
        cfg = open_checkpoint(args.a).cfg
        ids = load_tokens(args.match_data, cfg)
        data = token_rows(ids, min(cfg.n_ctx, 128), args.match_tokens, str(args.match_data))
    return open_pair(
        args.a,
        args.b,
        group=args.group if args.align else None,
        data=data,
        seed=args.seed,
        max_seconds=args.max_seconds,
        progress=note,
    )


def describe_alignment(pair) -> str:
    if pair.aligned is None:
        return f"not aligned: ‖A − B‖/‖A‖ = {pair.distance_before:.4f}"
    al = pair.aligned
    return (
        f"aligned B to A ({al['group']} group, {al['matching']} matching, {al['iterations']} round{'' if al['iterations'] == 1 else 's'}, "
        f"stopped by {al['stopped']}, {al['cpu_seconds']:.1f} CPU-s): "
        f"‖A − B‖/‖A‖ {pair.distance_before:.4f} → ‖A − B′‖/‖A‖ {pair.distance:.4f}"
    )


def register(sub) -> None:
    p = sub.add_parser(
        "merge",
        help="average two models of one architecture (optionally aligned first)",
        description="Write (1 − α)·A + α·B′ as a checkpoint in A's format, B′ = B or, with --align, "
        "B moved within its gauge group (same function) as close to A as the alignment finds.  "
        "α = 0 gives A bit for bit, α = 1 gives B′ (bit for bit without --align).",
    )
    add_pair_options(p, "checkpoint A (HF directory or llama GGUF); the result is written in its layout")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of B′ in the average")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist)")
    p.add_argument(
        "--dtype",
        default="same",
        choices=("same", "float64", "float32", "bfloat16"),
        help="dtype of the written weights (same: A's stored dtype of each tensor)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..merge import interpolate
    from ..models.checkpoint.writer import atomic_dir, refuse_existing, write_hf

    if not (0.0 <= args.alpha <= 1.0):
        raise GaugeAuditError("--alpha must lie in [0, 1]")
    out = Path(args.out)
    refuse_existing(out)  # before anything is read
    pair = pair_from_args(args)
    merged = interpolate(pair.params_a, pair.params_b, args.alpha)
    dtype = None if args.dtype == "same" else resolve_dtype(args.dtype)
    summary = {
        "a": str(args.a),
        "b": str(args.b),
        "alpha": args.alpha,
        "distance_before": pair.distance_before,
        "distance": pair.distance,
        "alignment": pair.aligned,
    }
    with atomic_dir(out) as tmp:
        written = write_hf(tmp, pair.a, pair.cfg, merged, dtype)
        summary["written"] = written
        (tmp / "merge.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        echo(describe_alignment(pair))
        print(
            f"wrote {out}: (1 − {args.alpha:g})·A + {args.alpha:g}·B′, {written['tensors']} tensors "
            f"({written['dtype']}, {written['bytes'] / 2**20:.1f} MiB), merge.json"
        )
    return 0
