"""The README tables of "Gauge fixing and comparing checkpoints".

1. Separation: over ``--seeds`` seeds, ``compare`` on transformed copies B = g·A (g a random element of
   every action that applies, κ = 4 per GL part) stored in float64 / float32 / bfloat16, against
   perturbed copies B = g·(A + δ), δ a random perturbation of relative size 1e-6 … 1e-1 of one
   randomly chosen weight tensor, stored the same way: the invariant distance (median, and the
   extreme toward the other side) and how many verdicts are EQUIVALENT / DIFFERENT.
2. Anchors: which transformations the weight fingerprints of HuRef (invariant matrices
   X·W_Q·W_Kᵀ·Xᵀ, X·W_V·W_O·Xᵀ, X·W_in·W_out·Xᵀ with X embedding rows; cosine similarity), AWM
   (linear assignment of the stream on the embeddings, then linear CKA of W_Q and W_K with the
   aligned model dimension as samples) and REEF (linear CKA of hidden states on the same inputs;
   also of the FFN hidden units) survive, computed on the transformed models, next to ``compare``.

    bash scripts/with-venv.sh python benchmarks/gauge_fix_table.py [--seeds 20] [--models ...] [--json F]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch

from gauge_audit.actions import ACTIONS, Element
from gauge_audit.gauge_fix import EQUIVALENT, compare, prepare
from gauge_audit.gauge_fix.base import match
from gauge_audit.models import bert, build, gpt2, layers
from gauge_audit.progress import bar
from gauge_audit.runtime import generator

SIZES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def transform(model, params, seed: int, actions=("composite",), kappa: float = 4.0):
    g = generator(seed)
    for a in actions:
        act = ACTIONS[a]
        params = act.apply(model.cfg, params, act.sample(model.cfg, params, g, kappa))
    return params


def perturb(params, seed: int, rel: float):
    g = generator(10_000 + seed)
    names = sorted(k for k in params if ".W_" in k or k.startswith("embed.W_E"))
    key = names[int(torch.randint(len(names), (1,), generator=g))]
    d = torch.randn(params[key].shape, generator=g, dtype=torch.float64)
    out = dict(params)
    out[key] = params[key] + rel * d * params[key].norm() / d.norm()
    return out


# ----------------------------------------------------------------------------- 1 separation
def separation(name: str, seeds: int, probes: int) -> list[dict]:
    model = build(name, device="cpu")
    prep = prepare(model.cfg, model.params, probes=probes)
    rows = []
    for dname, dtype in DTYPES.items():
        cells = {"transformed": []} | {rel: [] for rel in SIZES}
        for s in bar(range(seeds), desc=f"{name} {dname}", unit="seed"):
            b = transform(model, model.params, s)
            for label, params in [("transformed", b)] + [
                (rel, transform(model, perturb(model.params, s, rel), s)) for rel in SIZES
            ]:
                r = compare(
                    model.cfg,
                    model.params,
                    model.cfg,
                    {k: v.to(dtype) for k, v in params.items()},
                    probes=probes,
                    prepared=prep,
                    with_element=False,
                )
                cells[label].append((r.invariant_distance, r.tolerance, r.verdict))
        rows.append({"model": name, "storage": dname, "cells": cells})
    return rows


def _fmt_sep(rows: list[dict], seeds: int) -> str:
    head = (
        "| model | storage | transformed: invariant distance, median (max) | tolerance, median | EQUIVALENT |"
        + "".join(f" perturbed {rel:g}: median (min), DIFFERENT |" for rel in SIZES)
    )
    out = [head, "|" + "---|" * (5 + len(SIZES))]
    for r in rows:
        t = r["cells"]["transformed"]
        inv = [x[0] for x in t]
        line = (
            f"| {r['model']} | {r['storage']} | {statistics.median(inv):.1e} ({max(inv):.1e}) | "
            f"{statistics.median(x[1] for x in t):.1e} | {sum(x[2] == EQUIVALENT for x in t)}/{seeds} |"
        )
        for rel in SIZES:
            c = r["cells"][rel]
            v = [x[0] for x in c]
            line += f" {statistics.median(v):.1e} ({min(v):.1e}), {sum(x[2] != EQUIVALENT for x in c)}/{seeds} |"
        out.append(line)
    return "\n".join(out)


# ----------------------------------------------------------------------------- 2 anchors
def _cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA over the rows (samples) of x (n × p) and y (n × q)."""
    x = x - x.mean(0)
    y = y - y.mean(0)
    num = (y.T @ x).pow(2).sum()
    return float(num / ((x.T @ x).norm() * (y.T @ y).norm()))


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum() / (a.norm() * b.norm()))


def _blocks(cfg):
    return range(cfg.n_layers)


def huref(cfg, p, tokens: torch.Tensor) -> list[torch.Tensor]:
    """HuRef's invariant terms: per layer X·Σ_h W_Q[h]·W_K[j(h)]ᵀ·Xᵀ, X·Σ_h W_V[j(h)]·W_O[h]·Xᵀ and
    X·W_in·W_out·Xᵀ, X = the embedding rows of ``tokens`` (raw, no norm); compared term by term."""
    x = p["embed.W_E"][tokens]
    out = []
    for i in _blocks(cfg):
        a = f"blocks.{i}.attn"
        kv = [h // cfg.group_size for h in range(cfg.n_heads)]
        qk = sum(p[f"{a}.W_Q"][h] @ p[f"{a}.W_K"][kv[h]].T for h in range(cfg.n_heads))
        vo = sum(p[f"{a}.W_V"][kv[h]] @ p[f"{a}.W_O"][h] for h in range(cfg.n_heads))
        out += [x @ qk @ x.T, x @ vo @ x.T]
        if not cfg.experts:
            out.append(x @ p[f"blocks.{i}.mlp.W_in"] @ p[f"blocks.{i}.mlp.W_out"] @ x.T)
    return out


def awm(cfg, pa, pb) -> float:
    """AWM: a signed permutation of the stream found by linear assignment on the embedding columns,
    then the mean linear CKA of W_Q and W_K (rows = the aligned model dimension)."""
    ea, eb = pa["embed.W_E"], pb["embed.W_E"]
    corr = ea.T @ eb
    perm, _ = match(-corr.abs().T)  # B's column matched to each A column
    sign = torch.sign(corr[torch.arange(cfg.d_model), perm])
    sims = []
    for i in _blocks(cfg):
        for n in ("Q", "K"):
            wa = pa[f"blocks.{i}.attn.W_{n}"].permute(1, 0, 2).reshape(cfg.d_model, -1)
            wb = pb[f"blocks.{i}.attn.W_{n}"].permute(1, 0, 2).reshape(cfg.d_model, -1)[perm] * sign[:, None]
            sims.append(_cka(wa, wb))
    return sum(sims) / len(sims)


@contextlib.contextmanager
def capture():
    """Record every block's output (the residual stream) and every dense FFN's input."""
    seen = {"stream": [], "ffn_in": []}
    orig_block, orig_bert, orig_mlp = gpt2.block, bert.block, layers.mlp

    def block(params, cfg, i, x, trace=None):
        y = orig_block(params, cfg, i, x, trace)
        seen["stream"].append(y.reshape(-1, y.shape[-1]))
        return y

    def mlp(params, prefix, cfg, x, e=None):
        if e is None:
            seen["ffn_in"].append((prefix, x.reshape(-1, x.shape[-1])))
        return orig_mlp(params, prefix, cfg, x, e)

    gpt2.block = bert.block = block
    layers.mlp = mlp
    try:
        yield seen
    finally:
        gpt2.block, bert.block, layers.mlp = orig_block, orig_bert, orig_mlp


def _hidden(cfg, p, prefix, x):
    z = x @ p[f"{prefix}.W_in"] + (p[f"{prefix}.b_in"] if f"{prefix}.b_in" in p else 0)
    if cfg.act == "swiglu":
        return torch.nn.functional.silu(x @ p[f"{prefix}.W_gate"]) * z
    return layers.activation(cfg.act, z)


def reef(model, pa, pb, inputs) -> tuple[float, float | None]:
    """REEF: mean linear CKA of the hidden states (every block's output) of A and B on the same
    inputs; and of the FFN hidden units (dense FFNs)."""

    def run(p):
        with capture() as seen, torch.no_grad():
            model.forward(p, inputs)
        return seen

    sa, sb = run(pa), run(pb)
    stream = sum(_cka(a, b) for a, b in zip(sa["stream"], sb["stream"])) / len(sa["stream"])
    if not sa["ffn_in"]:
        return stream, None
    units = [
        _cka(_hidden(model.cfg, pa, pre, xa), _hidden(model.cfg, pb, pre, xb))
        for (pre, xa), (_, xb) in zip(sa["ffn_in"], sb["ffn_in"])
    ]
    return stream, sum(units) / len(units)


TRANSFORMS = [
    ("stream rotation", ("stream-rotation",)),
    ("stream signed permutation", ("signed-perm",)),
    ("uniform norm scaling", ("uniform-scale",)),
    ("norm-scale (per coordinate)", ("norm-scale",)),
    ("qk-gl", ("qk-gl",)),
    ("vo-gl", ("vo-gl",)),
    ("head + FFN permutations", ("head-perm", "ffn-perm")),
    ("ReLU / SwiGLU scaling", ("relu-scaling", "swiglu-scaling")),
    (
        "writer/reader ones, offsets, bias shifts",
        (
            "writer-ones",
            "reader-ones",
            "embed-offset",
            "segment-shift",
            "key-bias-shift",
            "value-bias-fold",
            "norm-shift",
        ),
    ),
    ("everything (composite)", ("composite",)),
]


def _special(model, params, name: str, seed: int):
    """Elements the actions draw only generically: a signed permutation of the stream (a plain
    permutation, which fixes 1, under LayerNorm) and one uniform scale of every weighted norm."""
    cfg, g = model.cfg, generator(seed)
    if name == "signed-perm":
        r = torch.eye(cfg.d_model, dtype=torch.float64)[torch.randperm(cfg.d_model, generator=g)]
        if cfg.norm.startswith("rmsnorm") or cfg.norm == "none":
            r = r * torch.where(torch.rand(cfg.d_model, generator=g) < 0.5, -1.0, 1.0).double()[None, :]
        return ACTIONS["stream-rotation"].apply(cfg, params, Element({"R": r}, 1.0))
    c = 2.0 + float(torch.rand(1, generator=g))
    norms = ACTIONS["norm-scale"].sample(cfg, params, g, 1.0).parts
    return ACTIONS["norm-scale"].apply(cfg, params, Element({k: torch.full_like(v, c) for k, v in norms.items()}, 1.0))


SPECIAL = {"signed-perm": "stream-rotation", "uniform-scale": "norm-scale"}


def anchors(name: str, seeds: int, only: tuple[str, ...] | None = None) -> list[dict]:
    model = build(name, device="cpu")
    cfg, pa = model.cfg, model.params
    tokens = torch.arange(min(cfg.vocab, 256))
    inputs = model.sample_inputs(123, batch=8)
    prep = prepare(cfg, pa, probes=2)
    ha = huref(cfg, pa, tokens)
    rows = []
    for label, acts in TRANSFORMS:
        if only is not None and label not in only:
            continue
        usable = [a for a in acts if ACTIONS[SPECIAL.get(a, a)].applies(cfg) is None]
        if not usable:
            continue
        worst = {"huref": 0.0, "awm": 0.0, "reef": 0.0, "reef_ffn": 0.0}
        verdicts = []
        for s in range(seeds):
            pb = pa
            for a in usable:
                pb = _special(model, pb, a, s) if a in SPECIAL else transform(model, pb, s, (a,))
            r_stream, r_ffn = reef(model, pa, pb, inputs)
            hb = huref(cfg, pb, tokens)
            gaps = {
                "huref": 1 - sum(_cos(a, b) for a, b in zip(ha, hb)) / len(ha),
                "awm": 1 - awm(cfg, pa, pb),
                "reef": 1 - r_stream,
                "reef_ffn": (1 - r_ffn) if r_ffn is not None else float("nan"),
            }
            for k, v in gaps.items():
                worst[k] = max(worst[k], abs(v)) if v == v else float("nan")
            r = compare(cfg, pa, cfg, pb, probes=2, prepared=prep, with_element=False)
            verdicts.append((r.verdict, r.invariant_distance))
        rows.append(
            {
                "model": name,
                "transformation": label,
                **worst,
                "compare": f"{sum(v == EQUIVALENT for v, _ in verdicts)}/{seeds} EQUIVALENT",
                "compare_invariant_max": max(d for _, d in verdicts),
            }
        )
    return rows


def _mark(x: float) -> str:
    if x != x:
        return "—"
    return f"✓ {x:.0e}" if x <= 1e-9 else f"✗ {x:.1e}"


def _fmt_anchors(rows: list[dict]) -> str:
    out = [
        "| model | transformation | HuRef 1−cos | AWM 1−CKA | REEF stream 1−CKA | REEF FFN units 1−CKA | compare |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['transformation']} | {_mark(r['huref'])} | {_mark(r['awm'])} | "
            f"{_mark(r['reef'])} | {_mark(r['reef_ffn'])} | {r['compare']} "
            f"(invariant ≤ {r['compare_invariant_max']:.0e}) |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--anchor-seeds", type=int, default=5)
    ap.add_argument("--probes", type=int, default=2)
    ap.add_argument("--models", default="gpt2-tiny,llama-tiny-gqa,qwen-tiny,moe-tiny,bert-tiny,minilm")
    ap.add_argument(
        "--anchor-models",
        default="llama-tiny,llama-tiny-noweight,gpt2-tiny,minilm",
        help="llama-tiny-noweight runs the two stream rows only (HuRef with unit norm weights)",
    )
    ap.add_argument("--skip-separation", action="store_true")
    ap.add_argument("--skip-anchors", action="store_true")
    ap.add_argument("--json", help="also write the raw numbers here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = {}
    if not args.skip_separation:
        sep = [row for m in args.models.split(",") for row in separation(m, args.seeds, args.probes)]
        result["separation"] = sep
        print(f"## Separation ({args.seeds} seeds, {args.probes} probes per model)\n")
        print(_fmt_sep(sep, args.seeds))
    if not args.skip_anchors:
        stream_rows = (TRANSFORMS[0][0], TRANSFORMS[1][0])
        anc = [
            row
            for m in args.anchor_models.split(",")
            for row in anchors(m, args.anchor_seeds, stream_rows if m.endswith("-noweight") else None)
        ]
        result["anchors"] = anc
        print(f"\n## Anchors ({args.anchor_seeds} seeds; worst over seeds; ✓: identical up to rounding, ≤ 1e-9)\n")
        print(_fmt_anchors(anc))
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
