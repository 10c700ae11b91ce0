"""``gauge-audit check``: torch invariance checks of gauge actions on the reference models."""

from __future__ import annotations

import json
import zipfile

import numpy as np

from ..actions import ACTIONS, get_action
from ..actions.base import Element, element_from_arrays
from ..errors import GaugeAuditError
from ..models import build, config_of, model_names
from ..numeric import HOLDS, HOLDS_WORST_CASE_ONLY, CheckResult, check, pairs
from ..progress import bar, echo
from ..runtime import eps, resolve_dtype


def register(sub) -> None:
    p = sub.add_parser("check", help="apply gauge actions to reference models and measure the output change",
                       description="Apply a gauge action (a random group element from --seed) and compare the "
                                   "model's outputs before and after against a derived tolerance.")
    p.add_argument("--model", help="model name (see --list)")
    p.add_argument("--action", help="action name (see --list)")
    p.add_argument("--all", action="store_true", help="every applicable (model, action) pair")
    p.add_argument("--list", action="store_true", help="list models and actions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="float64", choices=("float64", "float32", "bfloat16"))
    p.add_argument("--kappa", type=float, default=10.0, help="condition number of the sampled GL elements")
    p.add_argument("--element", metavar="NPZ", help="use this group element (an .npz file with the action's "
                   "parts, e.g. M of shape (layers, n_kv, d_head, d_head) for qk-gl) instead of a random one")
    p.add_argument("--json", action="store_true", help="one JSON object per (model, action) pair")
    p.set_defaults(func=run)


def _list() -> int:
    print("models:")
    for name in model_names():
        cfg = config_of(name)
        print(f"  {name:24s} {cfg.family:5s} d={cfg.d_model} L={cfg.n_layers} h={cfg.n_heads} "
              f"kv={cfg.n_kv_heads} norm={cfg.norm} act={cfg.act} pos={cfg.pos}{' tied' if cfg.tied else ''}")
    print("actions:")
    for a in ACTIONS.values():
        kind = "symmetry" if a.symmetry is True else ("contrast" if a.symmetry is False else "depends")
        print(f"  {a.name:24s} {kind:8s} {a.group}")
    return 0


HEADER = (f"{'model':24s} {'action':22s} {'max rel err':>11s} {'residual/ε':>11s} {'stat tol/ε':>11s} "
          f"{'tol/ε':>11s} {'κ':>8s}  verdict")


def _row(r: CheckResult) -> str:
    mark = "" if r.agrees else "   <-- differs from theory"
    routing = "" if r.routing_changed is None else f"  routing changed: {r.routing_changed}"
    return (f"{r.model:24s} {r.action:22s} {r.max_rel_error:11.3e} {r.residual_eps:11.4g} "
            f"{r.tolerance_statistical_eps:11.4g} {r.tolerance_eps:11.4g} {r.kappa:8.3g}  {r.verdict}{routing}{mark}")


def _load_element(path: str) -> Element:
    try:
        with np.load(path, allow_pickle=False) as data:
            parts = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise GaugeAuditError(f"cannot read element file {path}: {exc}") from None
    if not parts:
        raise GaugeAuditError(f"element file {path} holds no arrays")
    return element_from_arrays(parts)


def run(args) -> int:
    if args.list:
        return _list()
    if args.kappa < 1 or args.kappa != args.kappa:
        raise GaugeAuditError("--kappa must be a number >= 1")
    dtype = resolve_dtype(args.dtype)
    models = [args.model] if args.model else model_names()
    for m in models:
        config_of(m)  # unknown names fail before any work
    if args.action:
        get_action(args.action)
    if not (args.all or args.model or args.action):
        raise GaugeAuditError("give --model and/or --action, or --all, or --list")
    element = _load_element(args.element) if args.element else None
    if element is not None and not (args.model and args.action):
        raise GaugeAuditError("--element needs both --model and --action")
    todo = [(m, a) for m, a in pairs(models) if args.action in (None, a)]
    if args.model and args.action and not todo:
        reason = get_action(args.action).applies(config_of(args.model))
        raise GaugeAuditError(f"action {args.action} does not apply to {args.model}: {reason}")

    cache, results = {}, []
    if not args.json:
        print(HEADER)
    for m, a in bar(todo, desc="check", unit="pair") if len(todo) > 1 else todo:
        if m not in cache:
            cache[m] = build(m, seed=args.seed, device=args.device)
        r = check(cache[m], a, seed=args.seed, dtype=dtype, kappa=args.kappa, element=element)
        results.append(r)
        if args.json:
            print(json.dumps(r.to_json(), sort_keys=True))
        else:
            echo(_row(r))
    if not args.json:
        holds = sum(r.verdict == HOLDS for r in results)
        weak = sum(r.verdict == HOLDS_WORST_CASE_ONLY for r in results)
        differ = [r for r in results if not r.agrees]
        if len(results) == 1:
            print(f"tolerance (worst case)  = {results[0].tolerance_formula}")
            print(f"tolerance (statistical) = {results[0].tolerance_statistical_formula}")
        print(f"\n{len(results)} checks: {holds} HOLDS, {weak} HOLDS (worst-case bound only), "
              f"{len(results) - holds - weak} FAILS; {len(differ)} differ from theory.\n"
              f"tol = κ(g)·L·K·ε (rigorous: every rounding the same way), stat tol = κ(g)·λ·√(L·K)·ε (independent "
              f"roundings); K = Σ inner-product lengths along a block; ε({args.dtype}) = {eps(dtype):.3g}")
    return 1 if any(not r.agrees for r in results) else 0
