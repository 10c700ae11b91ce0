"""``gauge-audit canonicalize``: the canonical representative of a model's symmetry orbit."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ..errors import GaugeAuditError
from ..gauge_fix import canonicalize, function_check
from ..models import Model, build, config_of
from ..progress import echo

CHECKPOINT_NEEDS_LOADER = "checkpoint input needs the checkpoint loader (issue 13)"
_CHECKPOINT_SUFFIXES = (".gguf", ".safetensors", ".json", ".bin", ".pt")


def looks_like_path(name: str) -> bool:
    return os.sep in name or name.endswith(_CHECKPOINT_SUFFIXES) or os.path.exists(name)


def load_model(name: str, seed: int) -> Model:
    """A model by name (the built-in tiny families and ``minilm``, float64 on the CPU).  Checkpoint
    paths are recognised and refused until the checkpoint loader exists."""
    if looks_like_path(name):
        raise GaugeAuditError(f"{name}: {CHECKPOINT_NEEDS_LOADER}")
    config_of(name)  # unknown names: one line
    return build(name, seed=seed, device="cpu")


def register(sub) -> None:
    p = sub.add_parser("canonicalize", help="the canonical representative of a model's symmetry orbit",
                       description="Impose one gauge condition per symmetry family (the canonical form g·θ), "
                                   "report every condition, every non-uniqueness and what is not fixed, and check "
                                   "that the canonical form computes the same function.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model name (see gauge-audit check --list)")
    src.add_argument("--checkpoint", metavar="PATH", help="a checkpoint directory or file (needs issue 13)")
    p.add_argument("--seed", type=int, default=0, help="seed of a built-in random model (and of the check inputs)")
    p.add_argument("--out", metavar="DIR", help="write model.safetensors (canonical parameters, project layout), "
                   "element.npz (the canonicalising element g) and report.json; DIR must not exist")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(func=run)


def write_atomically(out: str, files: dict) -> None:
    """Write ``files`` (name → callable(path)) into a new directory ``out``: built in a temporary
    sibling and renamed at the end, so an error leaves nothing at ``out``."""
    target = Path(out)
    if target.exists():
        raise GaugeAuditError(f"--out {out} already exists")
    parent = target.resolve().parent
    if not parent.is_dir():
        raise GaugeAuditError(f"--out {out}: parent directory does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    try:
        for fname, write in files.items():
            write(tmp / fname)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_element(path: Path, element) -> None:
    np.savez(path, **{k: v.detach().cpu().numpy() for k, v in element.parts.items()})


def run(args) -> int:
    if args.checkpoint:
        raise GaugeAuditError(f"--checkpoint {args.checkpoint}: {CHECKPOINT_NEEDS_LOADER}")
    model = load_model(args.model, args.seed)
    t0 = time.perf_counter()
    canon = canonicalize(model.cfg, model.params)
    seconds = time.perf_counter() - t0
    fn = function_check(model.cfg, model.params, canon.params, canon.kappa, seed=args.seed)
    report = {"model": model.name, "seed": args.seed, "seconds": seconds, "function": fn, **canon.report()}
    if args.out:
        from safetensors.torch import save_file

        params = {k: v.contiguous() for k, v in canon.params.items()}
        write_atomically(args.out, {
            "model.safetensors": lambda p: save_file(params, str(p), metadata={"layout": "gauge-audit",
                                                                                  "model": model.name}),
            "element.npz": lambda p: save_element(p, canon.element()),
            "report.json": lambda p: p.write_text(json.dumps(report, indent=1, sort_keys=True, default=float)),
        })
    if args.json:
        print(json.dumps(report, sort_keys=True, default=float))
        return 0
    counts = report["conditions"]
    echo(f"{model.name}: {sum(v.numel() for v in model.params.values())} parameters, canonicalised in {seconds:.2f} s")
    echo(f"gauge conditions imposed: {report['conditions_total']} "
         f"({', '.join(f'{k} {v}' for k, v in counts.items())})")
    echo(f"largest condition residual: {max(report['condition_residual_max'].values(), default=0.0):.2e}")
    echo(f"element g: {len(canon.records)} steps, κ = {canon.kappa:.4g}")
    echo(f"same function: {fn['verdict']} (max rel. change {fn['residual_eps']:.3g} ε; statistical tolerance "
         f"{fn['tolerance_statistical_eps']:.4g} ε, worst case {fn['tolerance_eps']:.4g} ε)")
    ties = report["not_unique"]
    echo(f"non-unique choices: {sum(t['not_unique'] for t in ties) if ties else 'none'}")
    for t in ties:
        echo(f"  {t['step']}: {t['not_unique']} of {t['n']} {t['kind']} decisions in {t['where']} "
             f"(smallest margin {t['min_margin']:.2e} ≤ {t['threshold']:.2e})")
    for n in report["notes"]:
        echo(f"  note: {n}")
    for u in report["unfixed"]:
        echo(f"not fixed: {u['family']} — {u['reason']}")
    if args.out:
        echo(f"wrote {args.out}/model.safetensors, element.npz, report.json")
    return 0
