"""Gauge fixing of what a QK-norm leaves of the query–key gauge (step 12 of the pipeline under
``qk_norm`` = head | full).

The norm cuts qk-gl down to the rescaling of its weights (the action ``qk-norm-scale``): per layer
(a norm shared by the heads, Qwen3 / Gemma 3) or per layer and KV group (a full-width norm, OLMo 2)
and per *unit* — a RoPE plane, or a coordinate no rotation touches — γ_q ↦ c·γ_q, γ_k ↦ γ_k/c on
the unit's coordinates.  Per unit u the query side is the vector q_u of γ_q's entries on u (a
full-width norm: over every query head of the group) and the key side k_u that of γ_k; c maps
(‖q_u‖, ‖k_u‖) ↦ (|c|·‖q_u‖, ‖k_u‖/|c|), so ‖q_u‖·‖k_u‖ is invariant.

Special points: on a plane where γ_q and γ_k are both constant (Hugging Face initialises them to 1;
Gemma's (1 + w) norms at w = 0) the plane's rotation commutes with the norm and becomes a
symmetry (the nullity theory's qk-plane-rotation-special) that no step here fixes: reported as a
not-unique decision, never silently taken.
"""

from __future__ import annotations

import torch

from ..actions import Element
from ..actions.qk_norm import turn_applies as qk_turn_applies
from ..actions.qk_norm import units
from ..actions.strata import spread
from ..models.config import Config
from ..models.layers import rope_planes
from .base import SIGN_SENSITIVITY, Context, Params, signs


def _sets(cfg: Config) -> list[tuple[tuple, list[int], list[int]]]:
    """Per factor of the element, in its (KV group,) unit order: (index into c, γ_q indices, γ_k
    indices)."""
    e, g = cfg.d_head, cfg.group_size
    out: list[tuple[tuple, list[int], list[int]]] = []
    groups = [None] if cfg.qk_norm == "head" else range(cfg.n_kv_heads)
    for j in groups:
        for u, coords in enumerate(units(cfg)):
            if j is None:
                out.append(((u,), list(coords), list(coords)))
            else:
                q = [h * e + c for h in range(j * g, (j + 1) * g) for c in coords]
                out.append(((j, u), q, [j * e + c for c in coords]))
    return out


def _shape(cfg: Config) -> tuple[int, ...]:
    n = len(units(cfg))
    return (cfg.n_layers, n) if cfg.qk_norm == "head" else (cfg.n_layers, cfg.n_kv_heads, n)


def fix_qk_norm(ctx: Context) -> None:
    """Condition, per layer (and KV group) and unit u: ‖γ_q[u]‖ = ‖γ_k[u]‖, and Σ γ_q[u]³ > 0 (the
    sign c < 0 flips both sides): one condition per unit, the family's dimension.

    Reachable: c = ±(‖γ_k[u]‖/‖γ_q[u]‖)^{1/2} (qk-norm-scale).  Unique when both norms are non-zero
    (a zero side is left and reported) and the third moment does not vanish (sign ties reported).
    With a reference the sign is that of the overlap with the reference's weights.  Invariant under
    the later steps (vo-gl and the FFN scalings do not touch the QK-norm weights)."""
    cfg, p = ctx.cfg, ctx.params
    if cfg.qk_norm == "none":
        return
    c = torch.ones(_shape(cfg), dtype=torch.float64)
    margins, notes, special = [], [], []
    for layer in range(cfg.n_layers):
        pre = f"blocks.{layer}.attn"
        gq, gk = p[f"{pre}.q_norm"], p[f"{pre}.k_norm"]
        for idx, iq, ik in _sets(cfg):
            a, b = float(gq[iq].norm()), float(gk[ik].norm())
            if a == 0 or b == 0:
                unit = f"KV group {idx[0]} unit {idx[1]}" if len(idx) == 2 else f"unit {idx[0]}"
                notes.append(f"qk-norm-scale block {layer} {unit}: a zero norm weight, scale not fixed")
                continue
            s = (b / a) ** 0.5
            if ctx.reference is None:
                sign, margin = signs(gq[iq] * s)
                margins.append(margin.reshape(1))
                s *= float(sign)
            else:
                rq, rk = ctx.reference[f"{pre}.q_norm"][iq], ctx.reference[f"{pre}.k_norm"][ik]
                s *= -1.0 if float(rq @ gq[iq]) * s + float(rk @ gk[ik]) / s < 0 else 1.0
            c[(layer, *idx)] = s
        special += _plane_spreads(cfg, gq, gk)
    decisions = []
    if margins:
        decisions.append(ctx.decision("sign", "qk-norm-scale unit signs", torch.cat(margins), SIGN_SENSITIVITY))
    if special:
        # a relative change u of every entry moves a spread by at most 2u
        decisions.append(
            ctx.decision(
                "spectrum",
                "QK-norm weights on a RoPE plane (constant on γ_q and γ_k: the plane's rotation is a symmetry)",
                special,
                2.0,
            )
        )
    ctx.apply(
        "qk-norm-scale",
        "qk-norm-scale",
        Element({"c": c}, float(c.abs().max() / c.abs().min())),
        "per RoPE plane and unrotated coordinate: ‖γ_q‖ = ‖γ_k‖, γ_q signed by its third moment",
        decisions=decisions,
        notes=notes,
    )


def fix_qk_planes(ctx: Context) -> None:
    """The discrete part the QK-norm leaves on each RoPE plane (action ``qk-plane-turn``), after
    qk-norm-scale.  Per layer, plane (a, b) (and KV group of a full-width norm):

    * quarter-turn parity: the plane's norm weights are ordered, γ_q[a]² + γ_k[a]² ≥ γ_q[b]² + γ_k[b]²
      (over the group's query heads for a full-width norm) — margin the difference over the sum;
    * half turn, per KV group: the key columns of the plane, (W_K[j]·e_a, W_K[j]·e_b), have a positive
      third moment (with a reference: a positive overlap of the group's query and key columns with it).

    Unique off the special points (equal weights on a plane — where the continuous rotation is a
    symmetry, reported by qk-norm-scale — and a vanishing moment).  Invariant under the later steps
    (vo-gl and the FFN scalings touch neither W_Q, W_K nor the QK-norm weights) and keeps the earlier
    ones (a turn keeps every unit's norm and third moment of γ and every Gram of W_Q, W_K)."""
    cfg, p = ctx.cfg, ctx.params
    if qk_turn_applies(cfg) is not None or ctx.reuse("qk-plane-turn"):
        return
    planes, e = rope_planes(cfg), cfg.d_head
    turns = torch.zeros(cfg.n_layers, cfg.n_kv_heads, len(planes), dtype=torch.float64)
    parity_margins, sign_margins, overlaps = [], [], []
    for layer in range(cfg.n_layers):
        pre = f"blocks.{layer}.attn"
        gq, gk = p[f"{pre}.q_norm"].to(torch.float64), p[f"{pre}.k_norm"].to(torch.float64)
        wq, wk = p[f"{pre}.W_Q"].to(torch.float64), p[f"{pre}.W_K"].to(torch.float64)
        for j in range(cfg.n_kv_heads):
            heads = list(range(j * cfg.group_size, (j + 1) * cfg.group_size))
            qo = [h * e for h in heads] if cfg.qk_norm == "full" else [0]
            ko = [j * e] if cfg.qk_norm == "full" else [0]
            for u, (a, b) in enumerate(planes):
                if cfg.qk_norm == "full" or j == 0:
                    side_a = sum(float(gq[o + a]) ** 2 for o in qo) + sum(float(gk[o + a]) ** 2 for o in ko)
                    side_b = sum(float(gq[o + b]) ** 2 for o in qo) + sum(float(gk[o + b]) ** 2 for o in ko)
                    odd = side_a < side_b
                    parity_margins.append(abs(side_a - side_b) / max(side_a + side_b, 1e-300))
                else:  # a shared norm: group 0's parity for every group
                    odd = bool(turns[layer, 0, u] % 2)
                k = 1 if odd else 0
                # the plane's key (and query) columns after that quarter turn
                ka, kb = wk[j, :, a], wk[j, :, b]
                if odd:
                    ka, kb = -kb, ka
                if ctx.reference is None:
                    sign, margin = signs(torch.cat([ka, kb]))
                    sign_margins.append(margin.reshape(1))
                    half = float(sign) < 0
                else:
                    ref = ctx.reference
                    over = float(
                        ref[f"{pre}.W_K"][j, :, a].to(torch.float64) @ ka
                        + ref[f"{pre}.W_K"][j, :, b].to(torch.float64) @ kb
                    )
                    for h in heads:
                        qa, qb = wq[h, :, a], wq[h, :, b]
                        if odd:
                            qa, qb = -qb, qa
                        over += float(
                            ref[f"{pre}.W_Q"][h, :, a].to(torch.float64) @ qa
                            + ref[f"{pre}.W_Q"][h, :, b].to(torch.float64) @ qb
                        )
                    half = over < 0
                    size = sum(
                        float(t.norm()) ** 2 for t in (ka, kb, ref[f"{pre}.W_K"][j, :, a], ref[f"{pre}.W_K"][j, :, b])
                    )
                    size += sum(float(wq[h].norm()) ** 2 + float(ref[f"{pre}.W_Q"][h].norm()) ** 2 for h in heads)
                    overlaps.append(abs(over) / max(size / 2, 1e-300))
                turns[layer, j, u] = k + (2 if half else 0)
    decisions = []
    if parity_margins:
        # a relative change u of every entry moves the difference of squares by at most 2u of their sum
        decisions.append(
            ctx.decision("order", "qk-plane-turn norm-weight order per RoPE plane", torch.tensor(parity_margins), 2.0)
        )
    if sign_margins:
        decisions.append(
            ctx.decision("sign", "qk-plane-turn key-column signs", torch.cat(sign_margins), SIGN_SENSITIVITY)
        )
    if overlaps:
        # |⟨x, r⟩| over (‖x‖² + ‖r‖²)/2: a relative change u of the entries moves it by at most 2u
        decisions.append(ctx.decision("sign", "qk-plane-turn overlap with the reference", torch.tensor(overlaps), 2.0))
    ctx.apply(
        "qk-plane-turn",
        "qk-plane-turn",
        Element({"turns": turns}, 1.0),
        "per RoPE plane: norm weights ordered (γ_q[a]² + γ_k[a]² ≥ γ_q[b]² + γ_k[b]²), key columns signed by their third moment",
        decisions=decisions,
    )


def _plane_spreads(cfg: Config, gq: torch.Tensor, gk: torch.Tensor) -> list[float]:
    """Per RoPE plane (and KV group of a full-width norm): how far γ_q and γ_k are from constant on
    it, the larger of the two (0: the special point)."""
    if cfg.pos != "rope":
        return []
    e, g = cfg.d_head, cfg.group_size
    out = []
    for j in [None] if cfg.qk_norm == "head" else range(cfg.n_kv_heads):
        for a, b in rope_planes(cfg):
            if j is None:
                out.append(max(spread(gq[[a, b]]), spread(gk[[a, b]])))
            else:
                heads = [spread(gq[[h * e + a, h * e + b]]) for h in range(j * g, (j + 1) * g)]
                out.append(max(*heads, spread(gk[[j * e + a, j * e + b]])))
    return out


def cond_qk_norm(cfg: Config, p: Params) -> torch.Tensor | None:
    if cfg.qk_norm == "none":
        return None
    out = []
    for layer in range(cfg.n_layers):
        gq, gk = p[f"blocks.{layer}.attn.q_norm"], p[f"blocks.{layer}.attn.k_norm"]
        out += [(gq[iq] @ gq[iq] - gk[ik] @ gk[ik])[None] for _, iq, ik in _sets(cfg)]
    return torch.cat(out)
