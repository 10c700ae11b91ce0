"""``gauge-audit groups``: the gauge group of a model, layer factor by layer factor, with what
G_max predicts; ``--verify`` measures it on a small model with the same switches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import GaugeAuditError
from ..models.architectures import ARCHITECTURES
from ..models.derived import needs_derivation
from ..models.registry import config_of, model_names
from ..nullity.groups import G_MAX, discrete, factors, repeats, to_json, total, verify, verify_described

_MLA = ("q_lora_rank", "kv_lora_rank", "nope_dim", "v_dim", "moe_d_ff", "experts", "first_dense", "router")


def register(sub) -> None:
    p = sub.add_parser(
        "groups",
        help="the gauge group of a model per layer and factor, against the papers' G_max",
        description="The continuous gauge group of MODEL (a built-in name of `check --list`, an "
        "architecture of `nullity --family` at its small sizes, a checkpoint directory or a GGUF "
        "file), per layer and factor, its discrete part, and where the maximal-gauge paper's G_max "
        "differs.  A name that is both (gemma3) is the built-in model.",
    )
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--verify", action="store_true", help="measure the nullity of a small model with the same switches")
    p.add_argument("--seed", type=int, default=0, help="seed of the --verify model and its inputs")
    p.add_argument(
        "--derive",
        action="store_true",
        help="for a checkpoint directory: derive the description from transformers' modules and "
        "measure the group on its own forward even when the architecture has a family file "
        "(an architecture without one always takes this path)",
    )
    p.add_argument(
        "--budget", type=float, default=600.0, help="seconds the derived measurement may spend adding Jacobian rows"
    )
    p.set_defaults(func=run)


def resolve(model: str):
    # a built-in model first (gemma3 is the real Gemma 3 270M), then an architecture at small sizes
    if model in model_names():
        return config_of(model)
    if model in ARCHITECTURES:
        return ARCHITECTURES[model].config()
    path = Path(model)
    if path.exists():
        from ..models.checkpoint import open_checkpoint

        return open_checkpoint(path).cfg
    known = ", ".join(sorted(set(model_names()) | set(ARCHITECTURES)))
    raise GaugeAuditError(f"{model!r} is neither a model name, an architecture ({known}) nor a path")


def run_derived(args) -> int:
    from ..models.derived import SMALL_COPY, describe, load
    from ..nullity.found import measure

    model = load(Path(args.model), args.seed)
    desc = describe(model, args.seed)
    table = desc.special_vocabulary(model.params)
    if table is not None and model.source == SMALL_COPY:  # a size of our choosing need not be special
        model = load(Path(args.model), args.seed, vocab=table.safe)
        desc = describe(model, args.seed)
    found = measure(model, desc, args.seed, budget_s=args.budget, quiet=args.json)
    if args.json:
        print(json.dumps(found_json(args.model, desc, found), sort_keys=True))
    else:
        print(format_found(args.model, desc, found))
    return 0 if found.agrees else 1


def found_json(name: str, desc, found) -> dict:
    from dataclasses import asdict

    return {
        "model": name,
        "architecture": desc.architecture,
        "derived": True,
        "measured_on": found.source,
        "parameters": found.parameters,
        "layers": [{"layer": i, "mixer": m} for i, m in enumerate(desc.mixers)],
        "families": [asdict(f) for f in found.families],
        "discrete": [asdict(d) for d in found.discrete],
        "nullity": found.nullity,
        "threshold": found.threshold,
        "gap": found.gap,
        "notes": found.notes,
        "explained": found.explained,
        "rows": found.rows,
        "history": found.history,
        "converged": found.converged,
        "unexplained": found.unexplained,
        "unplaced": [{"tensor": p, "why": w} for p, w in desc.unplaced],
        "agrees": found.agrees,
    }


def format_found(name: str, desc, found) -> str:
    width = shutil.get_terminal_size((120, 24)).columns
    lines = [
        f"{name}: {desc.architecture} (derived from transformers' modules), d={desc.d_model}, {desc.n_layers} "
        f"layers; measured on {found.source} ({found.parameters:,} parameters)"
    ]
    for h in desc.heads:
        extra = [f"rotary {h.rotary}" if h.rotary else "NoPE"]
        extra += [f"{h.qk_norm} QK-norm"] if h.qk_norm != "none" else []
        extra += ["sinks"] if h.sinks else []
        extra += ["output gate"] if h.gated else []
        extra += ["biases"] if h.qb else []
        lines.append(
            f"  layer {h.layer}: {desc.mixers[h.layer]}, {h.n_heads} heads / {h.n_kv} KV of {h.head_dim} ({', '.join(extra)})"
        )
    for mh in desc.latent_heads:
        ranks = ", ".join(f"{lt.name} latent of {lt.rank}" for lt in desc.latents if lt.layer == mh.layer)
        lines.append(
            f"  layer {mh.layer}: {desc.mixers[mh.layer]}, latent attention, {mh.n_heads} heads (nope {mh.nope}, "
            f"rotary {mh.rope} shared by the keys, values {mh.v}; {ranks})"
        )
    for op in desc.opaque:
        lines.append(f"  layer {op.layer}: {desc.mixers[op.layer]} (its inner tensors: coordinate scalings only)")
    rows = [["family", "scope", "candidate", "generators", "flat", "margin"]]
    for f in found.families:
        margin = "-" if f.flat == f.generators else f"{f.smallest_kept_out / max(found.threshold, 1e-300):.1e}"
        rows.append([f.name, f.scope, f.what, str(f.generators), str(f.flat), margin])
    lines += _table(rows, width)
    lines.append(
        f"flat: ‖J·v‖ ≤ {found.threshold:.2e} (the threshold in J's spectral gap, ratio {found.gap:.1e}); "
        "margin: the flattest rejected direction over the threshold"
    )
    held = [d for d in found.discrete if d.holds]
    failed = [d for d in found.discrete if not d.holds]
    if found.discrete:
        lines.append("discrete, tested on the forward (relative change of the logits in ε; statistical tolerance):")
        for d in held:
            lines.append(f"  HOLDS  {d.name} {d.scope}: {d.what} ({d.residual:.3g} ε ≤ {d.tolerance:.3g} ε)")
        for d in failed:
            lines.append(f"  FAILS  {d.name} {d.scope}: {d.what} ({d.residual:.3g} ε)")
    conv = (
        f"converged: unchanged over the last {found.parameters:,}+ rows"
        if found.converged
        else "NOT converged within the row/time budget"
    )
    hist = ", ".join(f"{r}: {n if n >= 0 else 'no clear gap'}" for r, n in found.history)
    lines += [f"note: {n}" for n in found.notes]
    lines.append(f"nullity by rows: {hist}")
    lines.append(
        f"measured nullity {found.nullity} at {found.rows:,} rows ({found.rows / found.parameters:.1f} P, {conv}); "
        f"explained {found.explained}"
        + ("  (measured = explained)" if found.agrees else f"  ({found.nullity - found.explained} UNEXPLAINED)")
    )
    for u in found.unexplained[:10]:
        lines.append("  unexplained direction moves: " + ", ".join(f"{k} {v:.0%}" for k, v in list(u.items())[:4]))
    if len(found.unexplained) > 10:
        lines.append(f"  … {len(found.unexplained) - 10} more")
    if not desc.stream_described:
        lines.append(f"stream not described: {desc.residual}")
    lines.append(f"unplaced tensors: {'; '.join(desc.lines()) or 'none'}")
    lines.append(f"{found.seconds:.1f} s")
    return "\n".join(lines)


def run(args) -> int:
    path = Path(args.model)
    if needs_derivation(path) or (args.derive and (path / "config.json").is_file()):
        return run_derived(args)
    if args.derive:
        raise GaugeAuditError("--derive needs a Hugging Face checkpoint directory")
    cfg = resolve(args.model)
    fs = factors(cfg)
    out = to_json(cfg, fs)
    out["model"] = args.model
    v = verify(cfg, args.seed) if args.verify else None
    dv = verify_described(cfg, args.seed) if args.verify else None
    ok = True
    if v is not None:
        ok = v.measured == v.explained and all(a == b for _, a, b in v.rows)
        ok = ok and (isinstance(dv, str) or (dv is not None and dv.agrees))
        out["verify"] = {
            "sizes": {
                k: getattr(v.cfg, k)
                for k in ("d_model", "n_heads", "n_kv_heads", "d_head", "d_ff", "vocab", "n_layers")
                + (_MLA if v.cfg.latent_attention else ())
            },
            "measured_nullity": v.measured,
            "explained": v.explained,
            "group_total": v.factor_total,
            "factors": [{"family": n, "formula": a, "rank": b} for n, a, b in v.rows],
            "other_families": v.others,
            "described": _described_json(dv),
            "agrees": ok,
        }
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(format_table(args.model, cfg, fs, v, dv))
    return 0 if ok else 1


def _described_json(dv) -> dict:
    if dv is None or isinstance(dv, str):
        return {"refused": dv}
    f = dv.found
    return {
        "sizes": {k: getattr(dv.cfg, k) for k in ("d_model", "n_heads", "n_kv_heads", "d_head", "d_ff", "vocab")},
        "measured_nullity": f.nullity,
        "explained": f.explained,
        "rows": f.rows,
        "converged": f.converged,
        "flat": _flat_by_family(f),
        "discrete": {d.name: d.holds for d in f.discrete},
        "unexplained": f.unexplained,
        "agrees": f.agrees,
    }


def _flat_by_family(found) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in found.families:
        if r.flat:
            out[r.name] = out.get(r.name, 0) + r.flat
    return out


def _table(rows: list[list[str]], width: int) -> list[str]:
    """Columns padded to their widest cell; the widest column is cut to fit the terminal."""
    ws = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    while sum(ws) + 2 * (len(ws) - 1) > width and max(ws) > 12:
        ws[ws.index(max(ws))] -= 1
    fit = [[c if len(c) <= w else c[: w - 1] + "…" for c, w in zip(r, ws)] for r in rows]
    return ["  ".join(c.ljust(w) for c, w in zip(r, ws)).rstrip() for r in fit]


def _heads(cfg) -> str:
    if not cfg.latent_attention:
        return f"{cfg.n_heads} heads / {cfg.n_kv_heads} KV of {cfg.d_head}"
    moe = f", {cfg.experts} experts of {cfg.moe_d_ff} ({cfg.router})" if cfg.experts else ", dense"
    return (
        f"{cfg.n_heads} MLA heads (r_Q={cfg.q_lora_rank} r_KV={cfg.kv_lora_rank} d_nope={cfg.nope_dim} "
        f"d_rope={cfg.d_head} d_v={cfg.v_dim}){moe}"
    )


def format_table(name: str, cfg, fs, v, dv=None) -> str:
    width = shutil.get_terminal_size((120, 24)).columns
    rows = [["scope", "factor", "group", "dim", "generators", "G_max predicts", "differs"]]
    for f in fs:
        n = repeats(cfg, f.scope)
        kind = {"every layer": "layer", "dense layers": "dense layer", "MoE layers": "MoE layer"}.get(f.scope)
        scope = f"×{n} {kind}{'s' if n != 1 else ''}" if kind else "stream"
        rows.append([scope, f.name, f.group, str(f.dim), f.source or "-", f.gmax, f.differs or "="])
    lines = [f"{name}: {cfg.family}, d={cfg.d_model}, {cfg.n_layers} layers, {_heads(cfg)}"]
    lines += _table(rows, width)
    lines.append(f"total continuous dimension: {total(cfg, fs)}")
    lines.append("discrete: " + "; ".join(discrete(cfg)))
    lines.append(f"G_max: {G_MAX}")
    if v is not None:
        s = v.cfg
        heads = _heads(s) if s.latent_attention else f"{s.n_heads}/{s.n_kv_heads} heads of {s.d_head}"
        lines.append(
            f"verify (d={s.d_model}, {heads}, d_ff={s.d_ff}, vocab={s.vocab}, "
            f"{s.n_layers} layer{'s' if s.n_layers != 1 else ''}): measured nullity {v.measured}, explained {v.explained}"
            + (
                "  (measured = explained)"
                if v.measured == v.explained
                else f"  ({v.measured - v.explained} UNEXPLAINED)"
            )
        )
        for n, a, b in v.rows:
            lines.append(f"  {n:22s} group formula {a:5d}  family rank {b:5d}  {'=' if a == b else '≠'}")
        lines.append(
            "  other families (norm reparametrisations, small vocabulary): "
            + (", ".join(f"{k} {r}" for k, r in v.others.items()) or "none")
        )
    if isinstance(dv, str):
        lines.append(f"described per tensor: refused ({dv})")
    elif dv is not None:
        f = dv.found
        lines.append(
            f"described per tensor (vocab={dv.cfg.vocab}): candidate families tested on the forward, measured "
            f"nullity {f.nullity} at {f.rows:,} rows, flat candidates explain {f.explained}"
            + ("  (measured = explained)" if f.agrees else f"  ({f.nullity - f.explained} UNEXPLAINED)")
        )
        lines.append("  " + ", ".join(f"{k} {n}" for k, n in _flat_by_family(f).items()))
        held = [d.name for d in f.discrete if d.holds]
        lines.append("  discrete, held on the forward: " + (", ".join(dict.fromkeys(held)) or "none"))
    return "\n".join(lines)
