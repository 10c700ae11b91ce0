"""Claims that need several actions on several models, or a measurement beside the output check.

Each uses the reference models (random generic weights from the seed, float64) and the torch
check's derived tolerances (:mod:`gauge_audit.numeric`); sizes are the tiny reference models'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ..actions import get_action
from ..actions.blockwise import transformed
from ..models import build
from ..numeric import check
from ..runtime import eps, generator
from .moe_losses import _measured
from .registry import CORRECTED, FAILS, HOLDS, Finding, experiment


def _checks(pairs, seed: int) -> list[dict]:
    out = []
    for model, action in pairs:
        r = check(build(model, seed=seed, device="cpu"), action, seed=seed)
        out.append(
            {
                "model": model,
                "action": action,
                "verdict": r.verdict,
                "residual_eps": r.residual_eps,
                "tolerance_statistical_eps": r.tolerance_statistical_eps,
                "tolerance_eps": r.tolerance_eps,
            }
        )
    return out


def _all_hold(pairs, seed: int, what: str) -> Finding:
    rows = _checks(pairs, seed)
    bad = [r for r in rows if not r["verdict"].startswith("HOLDS")]
    worst = max(rows, key=lambda r: r["residual_eps"] / r["tolerance_eps"])
    text = (
        f"{what}: {len(rows) - len(bad)}/{len(rows)} (model, action) pairs hold; worst {worst['action']} on "
        f"{worst['model']}: {worst['residual_eps']:.3g} ε vs tol {worst['tolerance_statistical_eps']:.3g} ε "
        f"statistical, {worst['tolerance_eps']:.3g} ε worst-case"
    )
    if bad:
        b = bad[0]
        return Finding(
            FAILS, text, {"rows": rows}, counterexample=f"{b['action']} on {b['model']}: {b['residual_eps']:.3g} ε"
        )
    return Finding(HOLDS, text, {"rows": rows})


@experiment("kv-basis-rewrite")
def kv_basis_rewrite(seed: int, full: bool) -> Finding:
    """A KV-basis rewrite is the per-K/V-head change of basis of the cached keys (qk-gl) and values
    (vo-gl), absorbed into W_Q and W_O; lossless = the output unchanged to rounding."""
    models = ("attn-tiny-gqa", "llama-tiny-gqa", "llama-tiny-mqa")
    return _all_hold([(m, a) for m in models for a in ("qk-gl", "vo-gl")], seed, "K and V basis rewrites")


@experiment("mgs-persists-layernorm")
def mgs_persists_layernorm(seed: int, full: bool) -> Finding:
    """The attention gauge group (qk-gl, vo-gl, head-perm) on models with LayerNorm, affine or not."""
    models = ("gpt2-tiny", "gpt2-tiny-noaffine", "bert-tiny")
    return _all_hold(
        [(m, a) for m in models for a in ("qk-gl", "vo-gl", "head-perm")],
        seed,
        "G_max with LayerNorm (pre-LN GPT-2, post-LN BERT, no-affine)",
    )


@experiment("wiki-arch-table-vo-perm")
def wiki_arch_table_vo_perm(seed: int, full: bool) -> Finding:
    """The §3.4 table's value and head-permutation columns: GL(d_v)^h and S_h for GPT-2, BERT, LLaMA, Qwen."""
    models = ("gpt2-tiny", "bert-tiny", "llama-tiny", "qwen-tiny")
    return _all_hold([(m, a) for m in models for a in ("vo-gl", "head-perm")], seed, "GL(d_v)^h and S_h columns")


def _attn_parts(seed: int):
    model = build("attn-tiny", seed=seed, device="cpu")
    x = model.sample_inputs(seed)["x"]
    return model, x


def _head_probs(params: Mapping, cfg, x: torch.Tensor) -> torch.Tensor:
    """Per-head attention matrices softmax(q kᵀ/√d) of the first layer: (B, heads, n, n)."""
    pre = "blocks.0.attn"
    q = torch.einsum("bnd,hde->bhne", x, params[f"{pre}.W_Q"])
    k = torch.einsum("bnd,hde->bhne", x, params[f"{pre}.W_K"])
    if f"{pre}.b_Q" in params:
        q = q + params[f"{pre}.b_Q"][None, :, None, :]
        k = k + params[f"{pre}.b_K"][None, :, None, :]
    k = k.repeat_interleave(cfg.group_size, dim=1)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head), -1)


@experiment("mgs-attention-weights-preserved")
def mgs_attention_weights_preserved(seed: int, full: bool) -> Finding:
    """Under every element of G_max sampled (qk-gl, vo-gl, head-perm) the attention matrices are
    the original ones up to the head permutation; a QK element outside G_max (the same M on W_Q and
    W_K) changes them by O(1)."""
    model, x = _attn_parts(seed)
    cfg, p0 = model.cfg, model.params
    a0 = _head_probs(p0, cfg, x)
    rows = []
    for i, name in enumerate(("qk-gl", "vo-gl", "head-perm", "qk-same-action")):
        act = get_action(name)
        el = act.sample(cfg, p0, generator(seed + 1 + i), 10.0)
        a1 = _head_probs(transformed(act, cfg, p0, el), cfg, x)
        # best matching of transformed heads to original ones (h ≤ 4: every permutation)
        import itertools

        best = min(float((a1[:, list(pi)] - a0).abs().max()) for pi in itertools.permutations(range(cfg.n_heads)))
        rows.append({"action": name, "kappa": el.kappa, "max_change_up_to_perm": best})
    tol = 10.0 * cfg.d_model * cfg.d_head * eps(torch.float64) * 10.0  # κ·K·ε per score, ×10 for softmax
    true = [r for r in rows if r["action"] != "qk-same-action"]
    false = [r for r in rows if r["action"] == "qk-same-action"]
    ok = all(r["max_change_up_to_perm"] <= tol for r in true) and all(
        r["max_change_up_to_perm"] > 1e3 * tol for r in false
    )
    text = "; ".join(f"{r['action']}: {r['max_change_up_to_perm']:.2e}" for r in rows) + f" (tol {tol:.1e})"
    return Finding(
        HOLDS if ok else FAILS, "attention matrices up to head permutation: " + text, {"rows": rows, "tolerance": tol}
    )


@experiment("mgs-outside-gmax-order-one")
def mgs_outside_gmax_order_one(seed: int, full: bool) -> Finding:
    """Elements just outside G_max: W_Q ↦ W_Q·M, W_K ↦ W_K·M with M = I + t·S (S symmetric, so M is
    not orthogonal for t ≠ 0).  The output change is measured for t = 1, 10⁻², 10⁻⁴, 10⁻⁶."""
    model, x = _attn_parts(seed)
    cfg, p0 = model.cfg, model.params
    g = generator(seed + 7)
    S = torch.randn(cfg.n_kv_heads, cfg.d_head, cfg.d_head, generator=g, dtype=torch.float64)
    S = (S + S.transpose(-1, -2)) / 2
    with torch.no_grad():
        y0 = model.forward(p0, {"x": x})
        rows = []
        for t in (1.0, 1e-2, 1e-4, 1e-6):
            M = torch.eye(cfg.d_head, dtype=torch.float64) + t * S
            p1 = dict(p0)
            p1["blocks.0.attn.W_Q"] = p0["blocks.0.attn.W_Q"] @ M.repeat_interleave(cfg.group_size, 0)
            p1["blocks.0.attn.W_K"] = p0["blocks.0.attn.W_K"] @ M
            y1 = model.forward(p1, {"x": x})
            change = float((y1 - y0).abs().max() / y0.abs().max())
            rows.append({"t": t, "relative_change": change, "change_over_t": change / t})
    slopes = [math.log10(rows[i]["relative_change"] / rows[i + 1]["relative_change"]) / 2 for i in range(len(rows) - 1)]
    text = (
        "M = I + t·S: "
        + ", ".join(f"t = {r['t']:g} → {r['relative_change']:.2e}" for r in rows)
        + f"; log-log slopes {', '.join(f'{s:.3f}' for s in slopes)}"
    )
    details = {"rows": rows, "slopes": slopes}
    order_one = all(r["relative_change"] > 1e-2 for r in rows)
    if order_one:
        return Finding(HOLDS, text, details)
    linear = all(abs(s - 1) < 0.05 for s in slopes[1:])  # first order near G_max (t ≤ 10⁻²)
    if linear and rows[0]["relative_change"] > 1e-2:
        return Finding(
            CORRECTED,
            text + ": the change is proportional to the distance from G_max, O(1) only for elements at O(1) distance",
            details,
            corrected_rule="an element at distance t from G_max changes the output by Θ(t) (first order "
            "in t), so O(1) only at O(1) distance",
            counterexample=f"t = {rows[-1]['t']:g}: change {rows[-1]['relative_change']:.2e}",
        )
    return Finding(FAILS, text, details, counterexample=f"t = {rows[-1]['t']:g}: {rows[-1]['relative_change']:.2e}")


@experiment("wiki-head-perm-equation")
def wiki_head_perm_equation(seed: int, full: bool) -> Finding:
    """'𝒜^(i)(Q^(i),K^(i),V^(i)) = 𝒜^(j)(Q^(j),K^(j),V^(j)), ∀ i,j': every head's output the same?"""
    model, x = _attn_parts(seed)
    cfg, p = model.cfg, model.params
    pre = "blocks.0.attn"
    v = torch.einsum("bnd,hde->bhne", x, p[f"{pre}.W_V"]) + p[f"{pre}.b_V"][None, :, None, :]
    z = _head_probs(p, cfg, x) @ v.repeat_interleave(cfg.group_size, dim=1)
    diffs = [
        float((z[:, i] - z[:, j]).abs().max() / z.abs().max())
        for i in range(cfg.n_heads)
        for j in range(i + 1, cfg.n_heads)
    ]
    tol = cfg.d_model * cfg.n_ctx * eps(torch.float64) * 10
    text = f"smallest relative difference between two heads' outputs {min(diffs):.3f} (rounding ≤ {tol:.1e})"
    if min(diffs) > 1e3 * tol:
        return Finding(
            FAILS,
            text,
            {"differences": diffs},
            counterexample=f"attn-tiny, seed {seed}: heads 0 and 1 differ by {diffs[0]:.3f} relative",
        )
    return Finding(HOLDS, text, {"differences": diffs})


@experiment("wiki-theorem5-absolute")
def wiki_theorem5_absolute(seed: int, full: bool) -> Finding:
    """'‖Attention(X;θ) − Attention(X;τ(θ))‖_∞ ≤ 24 ε_mach for any τ ∈ G_max and any X': an absolute
    bound, tested with inputs of growing scale and elements of growing κ."""
    model = build("attn-tiny", seed=seed, device="cpu")
    e = eps(torch.float64)
    rows: list[dict[str, Any]] = []
    for scale in (1.0, 10.0):
        for kappa in (10.0, 1e4):
            inputs = {"x": model.sample_inputs(seed)["x"] * scale}
            r = check(model, "qk-gl", inputs, seed=seed, kappa=kappa)
            with torch.no_grad():
                norm = float(model.forward(model.params, inputs).abs().max())
            rows.append(
                {
                    "scale": scale,
                    "kappa": kappa,
                    "absolute_error": r.max_rel_error * norm,
                    "absolute_error_eps": r.max_rel_error * norm / e,
                    "verdict": r.verdict,
                }
            )
    worst = max(rows, key=lambda r: r["absolute_error"])
    text = (
        "absolute ∞-norm change: "
        + ", ".join(f"|X|×{r['scale']:g}, κ {r['kappa']:g}: {r['absolute_error_eps']:.3g} ε" for r in rows)
        + " vs the claimed 24 ε"
    )
    if worst["absolute_error_eps"] > 24 * 10:
        return Finding(
            FAILS,
            text,
            {"rows": rows},
            counterexample=f"inputs ×{worst['scale']:g}, κ = {worst['kappa']:g}: "
            f"{worst['absolute_error_eps']:.3g} ε_mach > 24 ε_mach",
        )
    return Finding(HOLDS, text, {"rows": rows})


@experiment("review-ln-single-token")
def review_ln_single_token(seed: int, full: bool) -> Finding:
    """LayerNorm(g·x; γ, β) against g·LayerNorm(x; γ, β) for one token, d_e = 8, g a random rotation
    fixing the all-ones vector; the same without γ, β as the control."""
    d = 8
    g = generator(seed + 3)
    ones = torch.ones(d, dtype=torch.float64) / math.sqrt(d)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    P = torch.eye(d, dtype=torch.float64) - torch.outer(ones, ones)
    K = P @ (A - A.T) @ P  # skew, K·1 = 0: exp(K) ∈ SO(d) fixes 1
    R = torch.linalg.matrix_exp(K)
    x = torch.randn(d, generator=g, dtype=torch.float64)
    gamma = 1 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
    beta = 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
    ln = torch.nn.functional.layer_norm
    affine = float(
        (ln(R @ x, (d,), gamma, beta, eps=0.0) - R @ ln(x, (d,), gamma, beta, eps=0.0)).abs().max()
        / ln(x, (d,), gamma, beta, eps=0.0).abs().max()
    )
    plain = float((ln(R @ x, (d,), eps=0.0) - R @ ln(x, (d,), eps=0.0)).abs().max() / ln(x, (d,), eps=0.0).abs().max())
    tol = 4 * d * eps(torch.float64)
    text = f"affine LayerNorm: relative mismatch {affine:.3f}; without γ, β: {plain:.2e} (rounding ≤ {tol:.1e})"
    details = {
        "affine": affine,
        "no_affine": plain,
        "tolerance": tol,
        "rotation_fixes_ones": float((R @ ones - ones).abs().max()),
    }
    if affine > 1e-2 and plain <= tol:
        return Finding(HOLDS, text, details)
    return Finding(FAILS, text, details, counterexample=text)


@experiment("wiki-hard-gating-breaks")
def wiki_hard_gating_breaks(seed: int, full: bool) -> Finding:
    """The §8.3 table's '可学习硬门控 ✗': a learned hard (top-1, argmax) gate on the router logits,
    before and after every true action on the MoE model."""
    m = _measured(seed)
    rows = [r for r in m["rows"] if r["output"].startswith("HOLDS")]
    changed = [r for r in rows if r["top1_changed"]]
    text = (
        f"learned hard (argmax) gate: top-1 choice changed for "
        f"{sum(r['top1_changed'] for r in rows)} tokens over {len(rows)} true actions "
        f"({', '.join(r['action'] for r in rows)})"
    )
    if changed:
        return Finding(HOLDS, text, m)
    return Finding(
        FAILS,
        text + ": the hard gate reads the same hidden states, so it is invariant like top-k",
        m,
        counterexample=f"{m['model']}, seed {seed}: no token's argmax expert changes under any action",
    )


@experiment("wiki-routing-table-invariant")
def wiki_routing_table_invariant(seed: int, full: bool) -> Finding:
    """The §8.3 table's ✓ rows: softmax probabilities, top-k choice and a random router (fixed seed,
    independent of the weights) before and after every action of G_max."""
    m = _measured(seed)
    rows = [r for r in m["rows"] if r["action"] in ("qk-gl", "vo-gl", "head-perm")]
    bad = [r for r in rows if r["probs_change"] > 1e3 * r["switch_bound"] or r["topk_changed"]]
    text = (
        "under qk-gl, vo-gl, head-perm: "
        + "; ".join(
            f"{r['action']}: softmax Δ {r['probs_change']:.1e}, top-k changes {r['topk_changed']}" for r in rows
        )
        + "; a random router does not read the weights"
    )
    return Finding(
        FAILS if bad else HOLDS, text, m, counterexample=(f"{bad[0]['action']} changes the routing" if bad else None)
    )


@experiment("wiki-ln-formula")
def wiki_ln_formula(seed: int, full: bool) -> Finding:
    """LN(x; γ, β) = γ ⊙ (x − μ)/σ + β (σ the population standard deviation) against torch's LayerNorm."""
    g = generator(seed + 11)
    rows = []
    for d in (4, 8, 64):
        x = torch.randn(16, d, generator=g, dtype=torch.float64)
        gamma = torch.randn(d, generator=g, dtype=torch.float64)
        beta = torch.randn(d, generator=g, dtype=torch.float64)
        mu, sigma = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True).sqrt()
        formula = gamma * (x - mu) / sigma + beta
        ref = torch.nn.functional.layer_norm(x, (d,), gamma, beta, eps=0.0)
        rows.append(
            {
                "d": d,
                "relative_difference": float((formula - ref).abs().max() / ref.abs().max()),
                "tolerance": 4 * d * eps(torch.float64),
            }
        )
    ok = all(r["relative_difference"] <= r["tolerance"] for r in rows)
    text = "; ".join(f"d = {r['d']}: {r['relative_difference']:.1e} (tol {r['tolerance']:.1e})" for r in rows)
    return Finding(
        HOLDS if ok else FAILS,
        "the formula against torch.nn.functional.layer_norm: " + text,
        {"rows": rows},
        counterexample=None if ok else text,
    )
