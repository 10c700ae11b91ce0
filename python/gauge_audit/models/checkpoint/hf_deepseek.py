"""Hugging Face ``DeepseekV3ForCausalLM`` and ``DeepseekV2ForCausalLM`` ↔ the project's layout
(models/deepseek.py).

File side (transformers' DeepseekV3Attention / DeepseekV3MoE):

* ``q_a_proj (r_Q, d)``, ``q_a_layernorm``, ``q_b_proj (h·(d_nope + d_rope), r_Q)`` — per head
  [nope | rope] rows; without a query latent ``q_proj (h·(d_nope + d_rope), d)``;
* ``kv_a_proj_with_mqa (r_KV + d_rope, d)`` = [W_DKV | W_KR] (the latent, then the shared RoPE key),
  ``kv_a_layernorm``, ``kv_b_proj (h·(d_nope + d_v), r_KV)`` — per head [W_UK | W_UV] rows;
* ``o_proj (d, h·d_v)``; biases on q_a_proj, kv_a_proj_with_mqa and o_proj with ``attention_bias``;
* MoE layers: ``mlp.gate.weight (E, d)``, ``mlp.gate.e_score_correction_bias (E)`` (V3), per expert
  ``mlp.experts.{e}.gate_proj / up_proj / down_proj`` (or transformers' fused in-memory
  ``experts.gate_up_proj`` / ``down_proj``), ``mlp.shared_experts.*``; dense layers ``mlp.*``.

DeepSeek-V2 differs in its router (softmax, ``topk_method`` greedy or group_limited_greedy, gates
never renormalised: transformers' V2 router does not read ``norm_topk_prob``), its RoPE (complex
products of interleaved pairs, which is the interleaved rotation) and an optional ``mlp_bias``
(refused).  The multi-token-prediction layers (``num_nextn_predict_layers``) are not part of the causal LM's
forward; transformers does not load them and neither does the reader.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import deepseek
from ..config import Config
from ..deepseek import DeepseekConfig
from .hf import (
    _LLAMA_IGNORE,
    Arch,
    Link,
    _act,
    _common,
    _float,
    _int,
    _rope,
    experts,
    fused_down,
    fused_gate_up,
    linear,
    linear_heads,
    linear_out_heads,
    llama_final_links,
    refuse,
    same,
)

ARCH, ARCH_V2 = "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"


def _count(arch: str, hf: dict, key: str, default: int, minimum: int = 0) -> int:
    v = hf.get(key, default)
    v = default if v is None else v
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise refuse(arch, key, v, f"must be an integer >= {minimum}")
    return v


def deepseek_config(arch: str, hf: dict) -> Config:
    _common(arch, hf)
    _act(arch, hf, "hidden_act", "silu", ("silu",))
    h = _int(arch, hf, "num_attention_heads")
    if hf.get("num_key_value_heads") not in (None, h):
        raise refuse(arch, "num_key_value_heads", hf["num_key_value_heads"], "MLA expands one key per head")
    v2 = arch == ARCH_V2
    wants = (("scoring_func", "softmax" if v2 else "sigmoid"), ("moe_layer_freq", 1))
    for key, want in wants + (() if v2 else (("topk_method", "noaux_tc"),)):
        if hf.get(key, want) != want:
            raise refuse(arch, key, hf[key], f"transformers' {arch} routes with {key} = {want!r} only")
    method = hf.get("topk_method", "greedy") if v2 else "noaux_tc"
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise refuse(arch, "topk_method", method, "transformers' V2 router knows greedy and group_limited_greedy")
    if hf.get("mlp_bias"):
        raise refuse(arch, "mlp_bias", hf["mlp_bias"], "biases on the FFNs are not part of the deepseek family")
    rope_dim = _int(arch, hf, "qk_rope_head_dim")
    if rope_dim % 2:
        raise refuse(arch, "qk_rope_head_dim", rope_dim, "RoPE rotates pairs of coordinates")
    rope = _rope(arch, {**hf, "head_dim": rope_dim})  # RoPE acts on the d_rope coordinates only
    bias = bool(hf.get("attention_bias", False))
    n_exp = _count(arch, hf, "n_routed_experts", 0)
    moe: dict[str, int | float | bool | str] = dict(experts=0, top_k=0)
    if n_exp:
        moe = dict(
            experts=n_exp,
            top_k=_int(arch, hf, "num_experts_per_tok"),
            router_renorm=False if v2 else bool(hf.get("norm_topk_prob", True)),
            router="softmax" if v2 else "sigmoid",
            moe_d_ff=_int(arch, hf, "moe_intermediate_size"),
            n_shared=_count(arch, hf, "n_shared_experts", 0),
            first_dense=_count(arch, hf, "first_k_dense_replace", 0),
            # V2's greedy routing is the group-limited one with a single group
            n_group=1 if method == "greedy" else _count(arch, hf, "n_group", 1, 1),
            topk_group=1 if method == "greedy" else _count(arch, hf, "topk_group", 1, 1),
            routed_scale=_float(arch, hf, "routed_scaling_factor", 1.0),
        )
    return deepseek.config(
        d_model=_int(arch, hf, "hidden_size"),
        n_layers=_int(arch, hf, "num_hidden_layers"),
        n_heads=h,
        n_kv_heads=h,
        d_head=rope_dim,
        d_ff=_int(arch, hf, "intermediate_size"),
        n_ctx=_int(arch, hf, "max_position_embeddings", 4096),
        vocab=_int(arch, hf, "vocab_size"),
        norm_eps=_float(arch, hf, "rms_norm_eps", 1e-6),
        **rope,
        rope_style="interleaved" if v2 or hf.get("rope_interleave", True) else "half",
        tied=bool(hf.get("tie_word_embeddings", False)),
        attn_bias=bias,
        out_bias=bias,
        q_lora_rank=_count(arch, hf, "q_lora_rank", 0),
        kv_lora_rank=_int(arch, hf, "kv_lora_rank"),
        nope_dim=_count(arch, hf, "qk_nope_head_dim", 0),
        v_dim=_int(arch, hf, "v_head_dim"),
        **moe,
    )


def split_rows(f: str, ps: tuple[str, ...], widths: tuple[int, ...]) -> Link:
    """One nn.Linear whose output rows are [A | B | …] (widths) ↔ the project's x·W pieces (in, width)."""
    return Link(
        (f,), ps, lambda w: tuple(x.T for x in w.split(widths, dim=0)), lambda *ws: (torch.cat([x.T for x in ws]),)
    )


def split_bias(f: str, ps: tuple[str, ...], widths: tuple[int, ...]) -> Link:
    return Link((f,), ps, lambda b: tuple(b.split(widths)), lambda *bs: (torch.cat(bs),))


def head_rows(f: str, ps: tuple[str, str], n: int, widths: tuple[int, int]) -> Link:
    """kv_b_proj (n·(a + b), r), per head [a | b] rows ↔ two per-head tensors (n, r, a), (n, r, b)."""

    def read(w):
        per = w.T.reshape(w.shape[1], n, sum(widths)).permute(1, 0, 2)  # (n, r, a + b)
        return tuple(x.contiguous() for x in per.split(widths, dim=-1))

    def write(a, b):
        per = torch.cat([a, b], dim=-1)  # (n, r, a + b)
        return (per.permute(1, 0, 2).reshape(per.shape[1], -1).T,)

    return Link((f,), ps, read, write)


def deepseek_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    assert isinstance(cfg, DeepseekConfig)
    h, r, e = cfg.n_heads, cfg.kv_lora_rank, cfg.d_head
    out = [same("model.embed_tokens.weight", "embed.W_E")]
    for i in range(cfg.n_layers):
        s, p = f"model.layers.{i}", f"blocks.{i}"
        a, q = f"{s}.self_attn", f"{p}.attn"
        out += [same(f"{s}.input_layernorm.weight", f"{p}.ln1.w")]
        out += [same(f"{s}.post_attention_layernorm.weight", f"{p}.ln2.w")]
        if cfg.q_lora_rank:
            out += [
                linear(f"{a}.q_a_proj.weight", f"{q}.W_DQ"),
                same(f"{a}.q_a_layernorm.weight", f"{q}.q_norm"),
                linear_heads(f"{a}.q_b_proj.weight", f"{q}.W_UQ", h),
            ]
            if cfg.attn_bias:
                out.append(same(f"{a}.q_a_proj.bias", f"{q}.b_DQ"))
        else:
            out.append(linear_heads(f"{a}.q_proj.weight", f"{q}.W_Q", h))
        out += [
            split_rows(f"{a}.kv_a_proj_with_mqa.weight", (f"{q}.W_DKV", f"{q}.W_KR"), (r, e)),
            same(f"{a}.kv_a_layernorm.weight", f"{q}.kv_norm"),
            head_rows(f"{a}.kv_b_proj.weight", (f"{q}.W_UK", f"{q}.W_UV"), h, (cfg.nope_dim, cfg.v_dim)),
            linear_out_heads(f"{a}.o_proj.weight", f"{q}.W_O", h),
        ]
        if cfg.attn_bias:
            out += [
                split_bias(f"{a}.kv_a_proj_with_mqa.bias", (f"{q}.b_DKV", f"{q}.b_KR"), (r, e)),
                same(f"{a}.o_proj.bias", f"{q}.b_O"),
            ]
        out += _ffn_links(cfg, i, has)
    return out + llama_final_links(cfg)


def _swiglu(m: str, q: str) -> list[Link]:
    return [
        linear(f"{m}.gate_proj.weight", f"{q}.W_gate"),
        linear(f"{m}.up_proj.weight", f"{q}.W_in"),
        linear(f"{m}.down_proj.weight", f"{q}.W_out"),
    ]


def _ffn_links(cfg: DeepseekConfig, i: int, has: Callable[[str], bool]) -> list[Link]:
    m, b = f"model.layers.{i}.mlp", f"blocks.{i}"
    if not cfg.moe_layer(i):
        return _swiglu(m, f"{b}.mlp")
    q, E = f"{b}.moe", range(cfg.experts)
    out = [linear(f"{m}.gate.weight", f"{q}.W_router")]
    if cfg.router == "sigmoid":
        out.append(same(f"{m}.gate.e_score_correction_bias", f"{q}.b_router"))
    if has(f"{m}.experts.gate_up_proj"):  # transformers' fused in-memory layout
        out += [
            fused_gate_up(f"{m}.experts.gate_up_proj", (f"{q}.W_gate", f"{q}.W_in")),
            fused_down(f"{m}.experts.down_proj", f"{q}.W_out"),
        ]
    else:
        out += [
            experts(tuple(f"{m}.experts.{e}.gate_proj.weight" for e in E), f"{q}.W_gate"),
            experts(tuple(f"{m}.experts.{e}.up_proj.weight" for e in E), f"{q}.W_in"),
            experts(tuple(f"{m}.experts.{e}.down_proj.weight" for e in E), f"{q}.W_out"),
        ]
    return out + (_swiglu(f"{m}.shared_experts", f"{b}.shared") if cfg.n_shared else [])


DEEPSEEK_ARCHS: dict[str, Arch] = {
    name: Arch(
        name,
        deepseek_config,
        deepseek_links,
        "model.layers",
        "model.layers.{i}.",
        "AutoModelForCausalLM",
        ignore=_LLAMA_IGNORE,
        notes=("multi-token-prediction layers, if any, are outside the causal LM's forward and not read",),
        expert_files=("mlp.", "gate_proj", "up_proj", "down_proj"),
    )
    for name in (ARCH, ARCH_V2)
}
