"""``gauge-audit align A B --out DIR``: B' = g·B for an element g of B's gauge group that brings
B' close to A (for merging models trained apart), written with a certificate that B' computes
B's function."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from ..actions.elements import save_element
from ..align import GROUPS, VO_GROUPS, align
from ..errors import GaugeAuditError
from ..gauge_fix import function_check
from ..models.checkpoint.writer import atomic_dir, refuse_existing
from ..models.config import same_architecture
from ..models.derived import needs_derivation
from ..progress import echo, enabled, ticker
from ..training.corpus import load_tokens, token_rows
from .canonicalize import Source, load_source

DISTANCES = "alignment.json"


def register(sub) -> None:
    p = sub.add_parser(
        "align",
        help="bring model B as close to model A as B's gauge group allows (same function)",
        description="Find an element g of B's gauge group that brings B' = g·B close to A: heads, KV groups "
        "and FFN units matched by assignment, the continuous factors (per-head QK and VO maps, the "
        "residual rotation after folding the norm weights, unit and norm scales) by Procrustes and "
        "least squares, alternated until the distance stops falling.  Writes B' in B's own format "
        "(a checkpoint: with transformers' float64 certificate that it computes B's function), the "
        "element (element.npz) and the distance ‖A − B'‖/‖A‖ per tensor group after each stage "
        f"({DISTANCES}).  Exit 0 when the function check holds, 1 when it fails, 2 for bad input.",
    )
    p.add_argument("a", metavar="A", help="model name or checkpoint path (HF directory, GGUF): the target")
    p.add_argument("b", metavar="B", help="model name or checkpoint path of the same architecture: the one moved")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist)")
    p.add_argument(
        "--group",
        choices=GROUPS,
        default="full",
        help="permutation: heads, KV groups, units (Git Re-Basin's group, plus heads); orthogonal: + one "
        "orthogonal matrix per KV group for QK and for VO (Zhang et al.'s); full: the whole group "
        "of the architecture",
    )
    p.add_argument("--vo-group", choices=VO_GROUPS, default="gl", help="VO maps in GL(d_v) or O(d_v) (full group)")
    p.add_argument(
        "--data",
        metavar="FILE",
        help="match heads and units by the correlations of their activations on this file: a .npy of token ids "
        "(any tokeniser) or text, tokenised at the byte level (as merge --match-data and barrier --data)",
    )
    p.add_argument("--match-tokens", type=int, default=4096, help="tokens of --data used, in rows of min(n_ctx, 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of a built-in random model A (and B), and of the run")
    p.add_argument("--seed-b", type=int, help="seed of a built-in model B when it differs from A's")
    p.add_argument("--max-seconds", type=float, default=120.0, help="time budget of the alignment loop")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def load(name: str, seed: int) -> Source:
    """A built-in model (float64, from ``seed``) or a checkpoint read in its stored dtype."""
    src = load_source(name, seed, native=True, fixable=False)
    return replace(src, params=dict(src.params))  # B' is built from a copy: the source stays as read


def _write(out: Path, b: Source, res, report: dict, seed: int) -> dict:
    """B' (B's format), element.npz, the report, and the function check: transformers' float64
    certificate for a checkpoint B (as ``transform`` writes it), the project forward for a
    built-in one."""
    with atomic_dir(out) as tmp:
        if b.checkpoint is not None:
            from ..models.checkpoint.writer import write_hf
            from ..transform import certify_written, write_tokenizer

            written = write_hf(
                tmp, b.checkpoint, b.cfg, res.params, None, progress=ticker("write", unit="tensor group")
            )
            notes = write_tokenizer(b.checkpoint, tmp)
            check = {
                "checkpoint": str(b.checkpoint.path),
                "kappa": res.kappa,
                "rounding_kappa": res.rounding_kappa,
                "written": written,
                "notes": notes,
                **certify_written(b.checkpoint, b.cfg, tmp, res.rounding_kappa, written),
            }
            (tmp / "certificate.json").write_text(json.dumps(check, indent=2, sort_keys=True, default=float) + "\n")
            check = {k: v for k, v in check.items() if k != "inputs"}
            check["what"] = "transformers' float64 logits of B and of the written B'"
        else:
            from safetensors.torch import save_file

            params = {k: v.contiguous() for k, v in res.params.items()}
            save_file(params, str(tmp / "model.safetensors"), metadata={"layout": "gauge-audit", "model": b.label})
            check = function_check(b.cfg, b.params, res.params, res.rounding_kappa, seed=seed, element=res.element)
            check["what"] = "the project forward of B and B' (float64)"
        report["function"] = check
        save_element(tmp / "element.npz", res.element)
        (tmp / DISTANCES).write_text(json.dumps(report, indent=1, sort_keys=True, default=float) + "\n")
    return check


def run(args) -> int:
    if not (args.max_seconds > 0 and math.isfinite(args.max_seconds)):
        raise GaugeAuditError("--max-seconds must be a finite number > 0")
    out = Path(args.out)
    refuse_existing(out)  # before anything is read
    if needs_derivation(Path(args.a)) or needs_derivation(Path(args.b)):
        return run_measured(args)
    a = load(args.a, args.seed)
    b = load(args.b, args.seed if args.seed_b is None else args.seed_b)
    same_architecture(a.cfg, b.cfg)
    data = None
    if args.data:
        ids = load_tokens(args.data, b.cfg.vocab)
        data = token_rows(ids, min(b.cfg.n_ctx, 128), args.match_tokens, str(args.data))
    res = align(
        b.cfg,
        a.params,
        b.params,
        group=args.group,
        vo_group=args.vo_group,
        data=data,
        seed=args.seed,
        max_seconds=args.max_seconds,
        # stage by stage on a terminal only: the table below repeats it, and a pipe stays quiet
        progress=echo if enabled() and not args.json else None,
    )
    report = {"a": a.label, "b": b.label, **res.to_json()}
    check = _write(out, b, res, report, args.seed)
    holds = check["verdict"] == "HOLDS"
    if args.json:
        print(json.dumps(report, sort_keys=True, default=float))
        return 0 if holds else 1
    echo(f"A: {a.label}")
    echo(f"B: {b.label}")
    echo(
        f"group: {res.group}"
        + (f" (VO in {'O' if res.vo_group == 'orthogonal' else 'GL'}(d_v))" if res.group == "full" else "")
        + f"; matching by {res.matching}; {res.iterations} iteration{'s' if res.iterations != 1 else ''}, "
        + f"stopped: {res.stopped}, {res.seconds:.2f} s"
    )
    print_table(res.stages)
    echo(
        f"element g: {len(report['element_steps'])} steps ({', '.join(dict.fromkeys(report['element_steps']))}), "
        f"κ ≤ {res.kappa:.4g} (dense steps: {res.rounding_kappa:.4g})"
    )
    echo(
        f"same function ({check['what']}): {check['verdict']} — max rel. change {check['residual_eps']:.3g} ε; "
        f"statistical tolerance {check['tolerance_statistical_eps']:.4g} ε, worst case {check['tolerance_eps']:.4g} ε"
    )
    for n in res.notes:
        echo(f"note: {n}")
    files = "config.json, model.safetensors, certificate.json" if b.checkpoint is not None else "model.safetensors"
    echo(f"wrote {out}: {files}, element.npz, {DISTANCES}")
    return 0 if holds else 1


def run_measured(args) -> int:
    """Architectures without a family file: g in B's group measured on its own forward (see
    :mod:`gauge_audit.align.measured`)."""
    from ..align.measured import align_checkpoints, format_report

    if args.group != "full" or args.vo_group != "gl" or args.data:
        raise GaugeAuditError(
            "--group, --vo-group and --data are not available for an architecture without a family file "
            "(its whole measured group is searched)"
        )
    report = align_checkpoints(
        Path(args.a),
        Path(args.b),
        Path(args.out),
        seed=args.seed,
        budget_s=args.max_seconds,
        say=(lambda line: None) if args.json else echo,
    )
    print(json.dumps(report, sort_keys=True) if args.json else format_report(report))
    return 0 if report["certificate"]["verdict"] == "HOLDS" else 1


def print_table(stages) -> None:
    """‖A − B'‖/‖A‖ per tensor group (columns) before and after each stage (rows)."""
    groups = [g for g in stages[0][1] if g != "total"] + ["total"]
    short = {"embeddings": "embed", "attention.qk": "attn.qk", "attention.vo": "attn.vo", "unembedding": "unembed"}
    echo(f"{'stage':14s} " + " ".join(f"{short.get(g, g):>9s}" for g in groups))
    for name, d in stages:
        echo(f"{name:14s} " + " ".join(f"{d[g]:9.3e}" for g in groups))
