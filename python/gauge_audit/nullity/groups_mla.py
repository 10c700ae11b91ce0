"""The gauge group of DeepSeek-V3/V2 (multi-head latent attention), factor by factor.

The derivation is nullity/families/deepseek.py's; each factor's ``source`` is the family there that
generates it, so ``groups --verify`` compares the two by name.  Per layer (h heads):

* the latents c_KV (and c_Q when q_lora_rank > 0): O(r) each — their RMSNorm passes rotations only,
  so a generic GL(r) element is not a symmetry — and their norm weights (ℝ^×)^r;
* query–key: GL(d_nope) per head on the unrotated coordinates, and one RoPE-commutant element per
  layer on the rope coordinates, since the RoPE key is shared by all heads;
* value–output: GL(d_v) per head;
* the FFNs: SwiGLU unit scaling of the dense layers, and in the MoE layers of every routed and
  shared expert;
* the router of a MoE layer: V3's score-correction bias only selects (E locally flat directions;
  with top_k = 1 and norm_topk_prob the router weights only select too), V2's softmax router keeps
  the offset (d).

The layers differ (dense below first_dense, MoE above), so the FFN and router factors are scoped
"dense layers" / "MoE layers".  Rows are tuples (scope, name, group, dim, source, gmax, differs),
the fields of :class:`.groups.Factor`, which builds them (this module sits below it).
"""

from __future__ import annotations

from ..models.deepseek import DeepseekConfig

Row = tuple[str, str, str, int, str, str, str]
BEYOND = "beyond G_max"


def _ranks(cfg: DeepseekConfig) -> list[tuple[str, int]]:
    return ([("c_Q", cfg.q_lora_rank)] if cfg.q_lora_rank else []) + [("c_KV", cfg.kv_lora_rank)]


def mla_factors(cfg: DeepseekConfig) -> list[Row]:
    h, nope, rope, v = cfg.n_heads, cfg.nope_dim, cfg.d_head, cfg.v_dim
    dk = nope + rope
    ranks = _ranks(cfg)
    names = ", ".join(n for n, _ in ranks)
    out: list[Row] = [
        (
            "every layer",
            "latents",
            " × ".join(f"O({r})" for _, r in ranks) + f" latent rotation ({names})",
            sum(r * (r - 1) // 2 for _, r in ranks),
            "latent-rotation",
            "-",
            f"{BEYOND}: O(r), not GL(r) — a latent's RMSNorm passes rotations only",
        ),
        (
            "every layer",
            "latent norms",
            f"(R^×)^{{{sum(r for _, r in ranks)}}} latent norm weight scaling",
            sum(r for _, r in ranks),
            "latent-norm-scale",
            "-",
            BEYOND,
        ),
        (
            "every layer",
            "QK",
            f"GL({nope})^{h} nope QK",
            h * nope * nope,
            "mla-nope-gl",
            f"GL({dk})^{h} per head ({h * dk * dk}; with RoPE its commutant)",
            f"MLA splits d_k = {nope} + {rope}: GL({nope}) per head on the nope part only (nope and rope never mix)",
        ),
        (
            "every layer",
            "QK rope",
            f"(C^×)^{{{rope // 2}}} RoPE commutant, shared key",
            rope,
            "mla-rope-commutant",
            f"RoPE commutant per head ({h * rope})",
            f"the RoPE key is shared by all {h} heads: one commutant element per layer, not per head",
        ),
        ("every layer", "VO", f"GL({v})^{h} VO", h * v * v, "mla-vo-gl", f"GL({v})^{h} ({h * v * v})", ""),
    ]
    n_moe = sum(cfg.moe_layer(i) for i in range(cfg.n_layers))
    if n_moe < cfg.n_layers:
        out.append(
            ("dense layers", "FFN", f"(R^×)^{{{cfg.d_ff}}} FFN scaling", cfg.d_ff, "swiglu-scaling", "-", BEYOND)
        )
    if n_moe:
        n = cfg.experts * cfg.moe_d_ff + cfg.n_shared * cfg.moe_d_ff
        shared = f" + {cfg.n_shared * cfg.moe_d_ff} shared" if cfg.n_shared else ""
        grp = f"(R^×)^{{{n}}} expert scaling ({cfg.experts}×{cfg.moe_d_ff} routed{shared})"
        out.append(("MoE layers", "experts", grp, n, "swiglu-scaling", "-", BEYOND))
        E, d = cfg.experts, cfg.d_model
        if cfg.router == "softmax":  # V2: softmax ignores one vector added to every expert's column
            out.append(("MoE layers", "router", f"R^{d} router offset", d, "router-offset", "-", ""))
        else:
            # the sigmoid has no shift invariance: V2's router offset is gone
            grp = f"R^{E} router bias, locally flat (selection only)"
            out.append(("MoE layers", "router", grp, E, "router-bias-selection", "-", BEYOND))
            if cfg.top_k == 1 and cfg.router_renorm:
                grp = f"R^{d * E} router weights, locally flat (top-1 gate s/s·ρ = ρ)"
                out.append(("MoE layers", "router weights", grp, d * E, "router-top1", "-", BEYOND))
    return out


def mla_discrete(cfg: DeepseekConfig) -> list[str]:
    # a head carries its own query, nope key, value and output; the shared RoPE key is untouched
    out = [f"head permutations S_{cfg.n_heads} (the shared RoPE key stays)"]
    ffn = []
    n_moe = sum(cfg.moe_layer(i) for i in range(cfg.n_layers))
    if n_moe < cfg.n_layers:
        ffn.append(f"S_{cfg.d_ff} per dense FFN")
    if n_moe:
        ffn.append(f"S_{cfg.moe_d_ff} per routed expert")
        if cfg.n_shared:
            ffn.append(f"S_{cfg.moe_d_ff * cfg.n_shared} in the shared expert")
    out.append("FFN unit permutations " + ", ".join(ffn))
    if n_moe:
        G, per = cfg.n_group, cfg.experts // cfg.n_group
        bias = " with their router bias" if cfg.router == "sigmoid" else ""
        if G > 1:  # the group ranking sees group membership: permute within groups and whole groups
            out.append(f"expert permutations S_{per} ≀ S_{G} (within and of the {G} groups){bias}")
        else:
            out.append(f"expert permutations S_{cfg.experts}{bias}")
    out.append("sign flips of the latent norm weights (with their readers' rows)")
    out.append("sign flips of the gated units' linear branch")
    return out


def mla_small(cfg: DeepseekConfig) -> DeepseekConfig:
    """The same switches (query latent or not, MoE or dense and a dense first layer, V2/V3 router,
    group-limited routing, top-1, biases, tied, ε = 0) at sizes a dense Jacobian handles in seconds."""
    ch: dict[str, object] = dict(
        d_model=6,
        n_heads=2,
        n_kv_heads=2,
        d_head=2,
        nope_dim=2,
        v_dim=2,
        kv_lora_rank=3,
        q_lora_rank=3 if cfg.q_lora_rank else 0,
        d_ff=6,
        vocab=12,
        n_ctx=8,
        rope_type="default",
        rope_params=(),
    )
    if not cfg.experts or cfg.first_dense >= cfg.n_layers:  # dense only
        ch.update(n_layers=1, first_dense=0, experts=0, top_k=0, n_group=1, topk_group=1)
    else:
        dense = cfg.first_dense > 0 and cfg.first_dense < cfg.n_layers
        G = min(cfg.n_group, 2)
        kept = G if cfg.topk_group >= cfg.n_group else 1
        top = 1 if cfg.top_k == 1 else min(cfg.top_k, 2, kept * 4 // G)
        ch.update(
            n_layers=2 if dense else 1,
            first_dense=1 if dense else 0,
            experts=4,
            moe_d_ff=3,
            n_shared=min(cfg.n_shared, 1),
            n_group=G,
            topk_group=kept,
            top_k=top,
        )
    return cfg.with_(**ch)
