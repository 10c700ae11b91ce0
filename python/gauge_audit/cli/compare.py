"""``gauge-audit compare A B``: is B a gauge-transformed copy of A?"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..actions import ACTIONS
from ..actions.elements import save_element
from ..errors import GaugeAuditError
from ..gauge_fix import EQUIVALENT, compare
from ..gauge_fix.comparison import VOUCH_LIMIT
from ..models import parameter_count
from ..models.derived import needs_derivation
from ..progress import echo, ticker
from ..runtime import LARGE_MODEL_PARAMS, eps, generator, keep_freed_memory, model_threads, resolve_dtype
from .canonicalize import Source, by_runs, float64_shortfall, load_source, write_atomically


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="is model B a gauge-transformed copy of model A?",
        description="Canonicalise both models and compare: raw and invariant distances (overall and "
        "per tensor group), the verdict EQUIVALENT / DIFFERENT against a tolerance from "
        "both models' storage precision, and for EQUIVALENT the group element mapping A "
        "to B.  Exit status 0 for EQUIVALENT, 1 for DIFFERENT or UNDECIDED (a tensor group whose tolerance "
        "cannot tell it from an independent model), 2 for bad input.",
    )
    p.add_argument("a", metavar="A", help="model name or checkpoint path (HF directory, llama GGUF)")
    p.add_argument("b", metavar="B", help="model name or checkpoint path of the same architecture")
    p.add_argument("--seed", type=int, default=0, help="seed of a built-in random model A (and B)")
    p.add_argument("--seed-b", type=int, help="seed of model B when it differs from A's")
    p.add_argument(
        "--transform",
        type=int,
        metavar="SEED",
        help="replace B by g·B for a random element g of every action that applies (from SEED)",
    )
    p.add_argument("--kappa", type=float, default=4.0, help="condition number of the GL parts of --transform")
    p.add_argument(
        "--perturb",
        type=float,
        metavar="REL",
        help="add a random perturbation of relative size REL to one tensor of B (--perturb-tensor)",
    )
    p.add_argument(
        "--perturb-tensor",
        default="blocks.0.attn.W_Q",
        metavar="NAME",
        help="the tensor --perturb changes (project layout name)",
    )
    p.add_argument(
        "--store-dtype",
        choices=("same", "float64", "float32", "bfloat16"),
        default="same",
        help="B is rounded to this dtype before comparing (same: as stored; built-in models: float64)",
    )
    p.add_argument("--probes", type=int, default=3, help="simulated roundings per model for the tolerance")
    p.add_argument(
        "--by-runs",
        action="store_true",
        help="compare one run of blocks at a time, never holding either model whole in float64 "
        "(default: only where a float64 copy exceeds the available memory; RMSNorm models without "
        "biases or learned positions)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write report.json and, for EQUIVALENT, element.npz (A → B: "
        "gauge-audit check --action composite --element DIR/element.npz); DIR must not exist",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _load(name: str, seed: int) -> Source:
    # read from the file on every pass (four over A, two over B), not held: holding a GGUF's
    # dequantized tensors saves a few seconds of dequantizing and costs their float32 copy
    # (SmolLM2: 0.54 GB beside A's float64 canonical form)
    return load_source(name, seed, native=True, resident=False)


def _b_params(args, b: Source):
    """B's parameters after the optional self-check edits, its description and storage dtype."""
    params, what, storage = b.params, b.label, b.storage_dtype
    if args.transform is not None or args.perturb is not None:  # edited in float64, not in the stored dtype
        params = {k: v.to(torch.float64) for k, v in params.items()}
    if args.transform is not None:
        if not args.kappa >= 1:
            raise GaugeAuditError("--kappa must be a number >= 1")
        act = ACTIONS["composite"]
        el = act.sample(b.cfg, params, generator(args.transform), args.kappa)
        params = act.apply(b.cfg, params, el)
        what += f", transformed by a random composite g (seed {args.transform}, κ ≤ {el.kappa:.3g})"
    if args.perturb is not None:
        if not (args.perturb >= 0 and math.isfinite(args.perturb)):
            raise GaugeAuditError("--perturb must be a finite number >= 0")
        if args.perturb_tensor not in params:
            raise GaugeAuditError(f"--perturb-tensor {args.perturb_tensor} is not a parameter of {args.b}")
        k = args.perturb_tensor
        d = torch.randn(params[k].shape, generator=generator(args.seed + 99), dtype=torch.float64)
        params = dict(params)
        params[k] = params[k] + args.perturb * d * params[k].norm() / d.norm()
        what += f", {k} perturbed by {args.perturb:g} (relative)"
    if args.store_dtype != "same":
        dtype = resolve_dtype(args.store_dtype)
        params = {k: v.to(dtype) for k, v in params.items()}
        storage = max(storage, dtype, key=lambda d: torch.finfo(d).eps)
        what += f", stored in {args.store_dtype}"
    return params, what, storage


def run(args) -> int:
    if args.probes < 1:
        raise GaugeAuditError("--probes must be >= 1")
    if needs_derivation(Path(args.a)) or needs_derivation(Path(args.b)):
        return run_measured(args)
    # checkpoints in their stored dtype, read again on each pass
    a = _load(args.a, args.seed)
    streamed = by_runs(a, "compare", "compare", "comparing", args.by_runs)
    b = _load(args.b, args.seed if args.seed_b is None else args.seed_b)
    if not streamed and float64_shortfall(b) is not None:
        streamed = by_runs(b, "compare", "compare", "comparing", True)
    # after the checkpoints are opened, which fixes glibc's mmap threshold at 1 MiB for streamed
    # checks: compare's eight canonicalisations allocate block-sized tensors thousands of times
    # (SmolLM2 by runs: 78 s → 43 s).  Not for billion-parameter models by runs: their block
    # tensors are mapped anyway, and the heap that is never trimmed would add its high-water mark
    # of smaller temporaries to a peak held near the memory available
    if not streamed or parameter_count(a.cfg) <= LARGE_MODEL_PARAMS:
        keep_freed_memory()
    pb, what_b, storage_b = _b_params(args, b)
    common = dict(probes=args.probes, seed=args.seed, storage_dtype_a=a.storage_dtype, storage_dtype_b=storage_b)
    if streamed:
        from ..gauge_fix.comparison_by_runs import compare_by_runs

        # the stream rotations' products on every thread (bit for bit the same products), the
        # rest on one
        with model_threads(parameter_count(a.cfg)):
            r = compare_by_runs(a.cfg, a.params, b.cfg, pb, **common, progress=ticker("compare", unit="run"))
    else:
        r = compare(a.cfg, a.params, b.cfg, pb, **common, parallel=True)
    e = max(eps(torch.float64), *(torch.finfo(getattr(torch, d)).eps for d in (r.storage_dtype_a, r.storage_dtype_b)))
    report = {"a": a.label, "b": what_b, **r.to_json(), "tolerance_eps": r.tolerance / e, "eps": e}
    files = {"report.json": lambda p: p.write_text(json.dumps(report, indent=1, sort_keys=True, default=float))}
    element = r.element
    if element is not None:
        files["element.npz"] = lambda p: save_element(p, element)
    if args.out:
        write_atomically(args.out, files)
    if args.json:
        print(json.dumps(report, sort_keys=True, default=float))
        return 0 if r.verdict == EQUIVALENT else 1
    echo(f"A: {report['a']}")
    echo(f"B: {what_b}")
    echo(f"verdict: {r.verdict}")
    echo(f"raw distance        {r.raw_distance:.3e}")
    echo(
        f"invariant distance  {r.invariant_distance:.3e}   tolerance {r.tolerance:.3e} = {r.tolerance / e:.4g} ε "
        f"(ε of the coarser storage dtype, {max(r.storage_dtype_a, r.storage_dtype_b, key=lambda d: torch.finfo(getattr(torch, d)).eps)})"
    )
    echo(f"{'tensor group':16s} {'raw':>10s} {'invariant':>10s} {'tolerance':>10s} {'ratio':>8s}")
    for g, v in r.groups.items():
        echo(
            f"{g:16s} {v['raw_distance']:10.3e} {v['invariant_distance']:10.3e} {v['tolerance']:10.3e} "
            f"{v['ratio']:8.3g}"
        )
    echo(
        f"tolerance = λ·√(σ_A² + σ_B²) per group, σ the largest response of the canonical form to {r.probes} "
        f"simulated roundings at each model's storage precision, λ = {r.lam:.3g}"
    )
    if r.element is not None:
        echo(
            f"element A → B: {r.element_steps} steps, κ ≤ {r.kappa:.4g}, ‖g·A − B‖/‖B‖ = {r.element_residual:.3e}"
            + (f"; saved to {args.out}/element.npz" if args.out else "")
        )
    vague = [g for g, v in r.groups.items() if v.get("undecided")]
    if vague:
        echo(
            f"undecided: {', '.join(vague)} — a tolerance ≥ {VOUCH_LIMIT:g} (relative) cannot tell these tensors "
            "from an independent model's, so it cannot vouch for EQUIVALENT"
        )
    ties = report["not_unique_a"] + report["not_unique_b"]
    if ties:
        echo(f"non-unique choices met (aligned to A in B): {sum(t['not_unique'] for t in ties)}")
    for u in report["unfixed"]:
        echo(f"not fixed: {u['family']} — {u['reason']}")
    return 0 if r.verdict == EQUIVALENT else 1


def run_measured(args) -> int:
    """An architecture without a family file: an element of the group measured on A's forward is
    searched for (see :mod:`gauge_audit.gauge_fix.measured`)."""
    from ..gauge_fix.measured import EQUIVALENT as FOUND
    from ..gauge_fix.measured import compare_checkpoints

    for flag, given in (
        ("--transform", args.transform),
        ("--perturb", args.perturb),
        ("--seed-b", args.seed_b),
    ):
        if given is not None:
            raise GaugeAuditError(f"{flag} is not available for an architecture without a family file")
    if args.store_dtype != "same":
        raise GaugeAuditError("--store-dtype is not available for an architecture without a family file")
    r, report = compare_checkpoints(args.a, args.b, args.seed)
    if args.out:
        write_atomically(
            args.out, {"report.json": lambda p: p.write_text(json.dumps(report, indent=1, sort_keys=True))}
        )
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0 if r.verdict == FOUND else 1
    echo(f"A: {args.a}")
    echo(f"B: {args.b}")
    echo(f"verdict: {r.verdict} — {r.why}")
    if report["group"]:
        echo(f"group measured on A: nullity {report['group']['nullity']}, explained {report['group']['explained']}")
    echo(f"element search: {'; '.join(r.steps)}")
    if r.matches:
        echo("matches (worst cosine): " + ", ".join(f"{k} {v:.4f}" for k, v in r.matches.items()))
    if r.residual is not None:
        echo(
            f"‖g·A − B‖/‖B‖ (worst tensor, {r.worst_tensor}) {r.residual:.3e}; tolerance "
            f"{r.residual_tolerance:.3e} (κ(g) = {r.kappa:.3g})"
        )
    echo(
        f"logits ‖y_B − y_A‖∞/‖y_A‖∞ {r.function_distance:.3e}; B's storage rounding and an element of "
        f"κ ≤ 1e6 explain at most {r.function_tolerance:.3e}"
    )
    echo(f"{r.seconds:.1f} s")
    return 0 if r.verdict == FOUND else 1
