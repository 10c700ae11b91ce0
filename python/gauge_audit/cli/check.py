"""``gauge-audit check``: torch invariance checks of gauge actions on the reference models."""

from __future__ import annotations

import json
from pathlib import Path

from ..actions import ACTIONS, get_action
from ..actions.elements import load_element
from ..errors import GaugeAuditError
from ..models import build, config_of, model_names, parameter_count
from ..models.checkpoint import open_checkpoint
from ..models.derived import needs_derivation
from ..numeric import HOLDS, HOLDS_WORST_CASE_ONLY, CheckResult, check
from ..progress import bar, echo
from ..runtime import eps, model_threads, resolve_dtype


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="apply gauge actions to reference models and measure the output change",
        description="Apply a gauge action (a random group element from --seed) and compare the "
        "model's outputs before and after against a derived tolerance.",
    )
    p.add_argument("--model", help="model name (see --list)")
    p.add_argument(
        "--checkpoint",
        metavar="DIR_OR_GGUF",
        help="a local Hugging Face checkpoint directory "
        "(config.json + model.safetensors or a sharded index) or a llama GGUF file, instead of --model; "
        "read block by block",
    )
    p.add_argument(
        "--text",
        help="inputs: this text, tokenized with the model's tokenizer (default: seeded "
        "random token ids); the row reports whether the greedy next token is unchanged",
    )
    p.add_argument("--action", help="action name (see --list)")
    p.add_argument("--all", action="store_true", help="every applicable (model, action) pair")
    p.add_argument("--list", action="store_true", help="list models and actions")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random group element, the random models and the random inputs"
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="where the models run (auto: CUDA when visible)",
    )
    p.add_argument(
        "--dtype",
        default="float64",
        choices=("float64", "float32", "bfloat16"),
        help="dtype both parameter sets are run in",
    )
    p.add_argument("--kappa", type=float, default=10.0, help="condition number of the sampled GL elements")
    p.add_argument(
        "--element",
        metavar="NPZ",
        help="use this group element (an .npz file with the action's "
        "parts, e.g. M of shape (layers, n_kv, d_head, d_head) for qk-gl) instead of a random one",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per (model, action) pair")
    p.set_defaults(func=run)


def _list() -> int:
    from ..models.registry import REAL, UNTIED

    print("models:")
    for name in model_names():
        cfg = config_of(name)
        real = "  (real weights)" if name in REAL or name in UNTIED else ""
        act = f"gated {cfg.gate_act}" if hasattr(cfg, "gate_act") else cfg.act  # Gemma: GeGLU
        print(
            f"  {name:24s} {cfg.family:5s} d={cfg.d_model} L={cfg.n_layers} h={cfg.n_heads} "
            f"kv={cfg.n_kv_heads} norm={cfg.norm} act={act} pos={cfg.pos}{' tied' if cfg.tied else ''}{real}"
        )
    print("actions:")
    for a in ACTIONS.values():
        kind = "symmetry" if a.symmetry is True else ("contrast" if a.symmetry is False else "depends")
        print(f"  {a.name:24s} {kind:8s} {a.group}")
    return 0


def _header(width: int) -> str:
    return (
        f"{'model':{width}s} {'action':22s} {'max rel err':>11s} {'residual/ε':>11s} {'stat tol/ε':>11s} "
        f"{'tol/ε':>11s} {'κ':>8s}  verdict"
    )


def _row(r: CheckResult, decode=None, width: int = 24) -> str:
    mark = "" if r.agrees else "   <-- differs from theory"
    routing = "" if r.routing_changed is None else f"  routing changed: {r.routing_changed}"
    nxt = ""
    if "next_token_unchanged" in r.extra:
        word = f" {decode(r.extra['next_token'][-1])!r}" if decode else ""
        nxt = f"  next token{word} {'unchanged' if r.extra['next_token_unchanged'] else 'CHANGED'}"
    verdict = r.verdict
    if r.special:  # a contrast at one of its special points: the theory predicts HOLDS here
        verdict += (
            " (special point) — holds here because "
            if r.holds
            else " — predicted to hold here (special point) because "
        ) + r.special
    elif r.unresolved:
        verdict += " (not a contradiction) — " + r.unresolved
    return (
        f"{r.model:{width}s} {r.action:22s} {r.max_rel_error:11.3e} {r.residual_eps:11.4g} "
        f"{r.tolerance_statistical_eps:11.4g} {r.tolerance_eps:11.4g} {r.kappa:8.3g}  {verdict}"
        f"{routing}{nxt}{mark}"
    )


def _text_inputs(args, model, ckpt) -> tuple[dict | None, object]:
    """Token ids of ``--text`` from the checkpoint's tokenizer (and a decoder for the report)."""
    if args.text is None:
        return None, None
    if ckpt is None:
        raise GaugeAuditError(
            "--text needs a model with a tokenizer: --checkpoint, or --model minilm / smollm2 / gemma3"
        )
    from ..reference import tokenizer

    tok = tokenizer(ckpt)
    ids = tok(args.text, return_tensors="pt")["input_ids"]
    cfg = model.cfg
    if ids.shape[1] == 0:
        raise GaugeAuditError("--text gives no tokens")
    if cfg.pos == "learned" and ids.shape[1] > cfg.n_ctx:
        raise GaugeAuditError(f"--text gives {ids.shape[1]} tokens; the model takes at most {cfg.n_ctx}")
    inputs = {"tokens": ids}
    if cfg.n_types:
        inputs["token_types"] = ids.new_zeros(ids.shape)
    return inputs, tok.decode


def run(args) -> int:
    if args.list:
        return _list()
    if args.kappa < 1 or args.kappa != args.kappa:
        raise GaugeAuditError("--kappa must be a number >= 1")
    if args.checkpoint and needs_derivation(Path(args.checkpoint)):
        return run_measured(args)
    dtype = resolve_dtype(args.dtype)
    if args.model and args.checkpoint:
        raise GaugeAuditError("give --model or --checkpoint, not both")
    cache, ckpt = {}, None
    if args.checkpoint:
        ckpt = open_checkpoint(args.checkpoint)
        # Several checks re-read every block each time; keep the tensors when the float64 copy is small
        # next to the free memory, stream them otherwise.
        several = not args.action or args.all
        # A streamed model's forwards drop each block before they read the next: its large reads
        # reuse the storages of the block before (at 8 B: 470 MB matrices, otherwise faulted in afresh).
        resident = several and ckpt.fits_in_memory()
        model = ckpt.model(device=args.device, resident=resident, reuse=not resident)
        cache[model.name] = model
        models, cfg_of = [model.name], {model.name: ckpt.cfg}
    else:
        models = [args.model] if args.model else model_names()
        cfg_of = {m: config_of(m) for m in models}  # unknown names fail before any work
        ckpt = _real_checkpoint(args.model) if args.model else None
    if args.action:
        get_action(args.action)
    if not (args.all or args.model or args.checkpoint or args.action):
        raise GaugeAuditError("give --model, --checkpoint and/or --action, or --all, or --list")
    one = args.model or args.checkpoint
    element = load_element(args.element) if args.element else None
    if element is not None and not (one and args.action):
        raise GaugeAuditError("--element needs both --model (or --checkpoint) and --action")
    todo = [
        (m, a.name)
        for m in models
        for a in ACTIONS.values()
        if args.action in (None, a.name) and a.applies(cfg_of[m]) is None
    ]
    if one and args.action and not todo:
        reason = get_action(args.action).applies(cfg_of[models[0]])
        raise GaugeAuditError(f"action {args.action} does not apply to {models[0]}: {reason}")
    if args.text is not None and not one:
        raise GaugeAuditError("--text needs --model or --checkpoint")
    if args.model and args.model not in cache and args.text is not None:
        cache[args.model] = build(args.model, seed=args.seed, device=args.device)
    inputs, decode = _text_inputs(args, cache.get(models[0]), ckpt) if args.text is not None else (None, None)

    results, width = [], max(24, *(len(m) for m in models))
    for m, a in bar(todo, desc="check", unit="pair") if len(todo) > 1 else todo:
        if m not in cache:
            cache[m] = build(m, seed=args.seed, device=args.device)
        with model_threads(parameter_count(cfg_of[m])):
            r = check(cache[m], a, inputs, seed=args.seed, dtype=dtype, kappa=args.kappa, element=element)
        results.append(r)
        if args.json:
            print(json.dumps(r.to_json(), sort_keys=True))
        else:
            # the header only once the first check has run: bad weights (NaN, a truncated
            # shard), found while reading, leave their one error line alone on the terminal
            if len(results) == 1:
                echo(_header(width))
            echo(_row(r, decode, width))
    if not args.json:
        holds = sum(r.verdict == HOLDS for r in results)
        weak = sum(r.verdict == HOLDS_WORST_CASE_ONLY for r in results)
        unresolved = sum(not r.decided for r in results)
        differ = [r for r in results if not r.agrees]
        special = sum(bool(r.special) for r in results)
        untestable = sum(bool(r.unresolved) for r in results)
        if len(results) == 1:
            print(f"tolerance (worst case)  = {results[0].tolerance_formula}")
            print(f"tolerance (statistical) = {results[0].tolerance_statistical_formula}")
        print(
            f"\n{len(results)} checks: {holds} HOLDS, {weak} HOLDS (worst-case bound only), "
            f"{len(results) - holds - weak - unresolved} FAILS, {unresolved} UNDECIDED (a worst-case tolerance "
            f"≥ 1: {args.dtype} cannot resolve these); {len(differ)} differ from theory"
            + (f"; {special} false contrast(s) at a special point, where the theory predicts HOLDS" if special else "")
            + (f"; {untestable} at a point that cannot test the prediction (see the row)" if untestable else "")
            + ".\n"
            f"tol = κ(g)·L·K·ε (rigorous: every rounding the same way), stat tol = κ(g)·λ·√(L·K)·ε (independent "
            f"roundings); K = Σ inner-product lengths along a block; ε({args.dtype}) = {eps(dtype):.3g}"
        )
    return 1 if any(not r.agrees for r in results) else 0


def run_measured(args) -> int:
    """An architecture without a family file: one finite element of every family of the group
    measured on transformers' own forward (see :mod:`gauge_audit.measured`)."""
    from ..measured import agrees, check_all, format_rows, measured

    for flag, given in (("--model", args.model), ("--text", args.text), ("--element", args.element)):
        if given is not None:
            raise GaugeAuditError(f"{flag} is not available for an architecture without a family file")
    if args.dtype != "float64" or args.device == "cuda":
        raise GaugeAuditError("an architecture without a family file is checked in float64 on the CPU")
    m = measured(Path(args.checkpoint), args.seed, 600.0, quiet=args.json, what="check")
    rows = check_all(m, args.seed, args.kappa, args.action)
    if args.action and not rows:
        from ..measured import choices

        raise GaugeAuditError(
            f"{args.action!r} is no part of the group measured on {args.checkpoint} (measured: {', '.join(choices(m))})"
        )
    if args.json:
        print(json.dumps(m.to_json(), sort_keys=True))
    else:
        print(format_rows(args.checkpoint, m))
        print(
            f"\n{len(rows)} checks: {sum(r.verdict.startswith('HOLDS') for r in rows)} HOLDS; "
            "tol = κ·L·K·ε, stat tol = κ·λ·√(L·K)·ε, K the inner-product lengths along a block; ε(float64)"
        )
    return 0 if agrees(m) else 1


def _real_checkpoint(name: str):
    """The checkpoint behind a named real model (for its tokenizer), else None."""
    from ..models import gemma3, minilm, smollm2
    from ..models.registry import UNTIED

    base = UNTIED.get(name, name)
    return {"minilm": minilm.checkpoint, "smollm2": smollm2.checkpoint, "gemma3": gemma3.checkpoint}.get(
        base, lambda: None
    )()
