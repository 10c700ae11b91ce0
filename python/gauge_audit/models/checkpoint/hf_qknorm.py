"""Hugging Face architectures with a QK-norm: Qwen3 and Qwen3-MoE (one RMSNorm over d_head shared
by the heads) and OLMo 2 (one RMSNorm over all heads jointly; no pre-norms, normed sublayer outputs).
Config reading and tensor links in the style of :mod:`.hf`, whose helpers they use.

Qwen3-MoE files store expert e's SwiGLU as ``mlp.experts.{e}.gate_proj / up_proj / down_proj`` and
the router as ``mlp.gate.weight (E, d)``; every layer must be sparse (``decoder_sparse_step`` 1, no
``mlp_only_layers``) — mixed dense/sparse stacks are refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import olmo2, qwen3
from ..config import Config
from .hf import (
    _LLAMA_IGNORE,
    Arch,
    Link,
    _act,
    _attn_linear,
    _common,
    _float,
    _heads,
    _int,
    _rope,
    _window,
    experts,
    linear,
    llama_final_links,
    refuse,
    same,
)


def qk_norm_config(arch: str, hf: dict) -> Config:
    _common(arch, hf)
    window = _window(arch, hf, always=False)
    _act(arch, hf, "hidden_act", "silu", ("silu",))
    d, h = _int(arch, hf, "hidden_size"), _int(arch, hf, "num_attention_heads")
    kv = _int(arch, hf, "num_key_value_heads", h) if hf.get("num_key_value_heads") is not None else h
    bias = bool(hf.get("attention_bias", False))
    common = dict(
        d_model=d,
        n_layers=_int(arch, hf, "num_hidden_layers"),
        n_heads=h,
        n_kv_heads=kv,
        d_head=_heads(arch, hf, d, h),
        d_ff=_int(arch, hf, "intermediate_size"),
        n_ctx=_int(arch, hf, "max_position_embeddings", 2048),
        vocab=_int(arch, hf, "vocab_size"),
        norm_eps=_float(arch, hf, "rms_norm_eps", 1e-6),
        **_rope(arch, hf),
        window=window,
        tied=bool(hf.get("tie_word_embeddings", False)),
        attn_bias=bias,
        out_bias=False,
    )
    if arch == "Olmo2ForCausalLM":
        return olmo2.config(**{**common, "out_bias": bias})
    if arch != "Qwen3MoeForCausalLM":
        return qwen3.config(**common)
    if hf.get("mlp_only_layers"):
        raise refuse(arch, "mlp_only_layers", hf["mlp_only_layers"], "dense layers inside a mixture-of-experts stack")
    if hf.get("decoder_sparse_step", 1) != 1:
        raise refuse(arch, "decoder_sparse_step", hf["decoder_sparse_step"], "dense layers between sparse ones")
    n_exp = hf.get("num_experts", hf.get("num_local_experts"))
    return qwen3.config(
        **{**common, "d_ff": _int(arch, hf, "moe_intermediate_size")},
        experts=_int(arch, {"num_experts": n_exp}, "num_experts"),
        top_k=_int(arch, hf, "num_experts_per_tok"),
        router_renorm=bool(hf.get("norm_topk_prob")),
    )


def qk_norm_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    out = [same("model.embed_tokens.weight", "embed.W_E")]
    # OLMo 2 has no input norms: its two norms act on the sublayer outputs (project ln1, ln2)
    norms = (
        ("post_attention_layernorm", "post_feedforward_layernorm")
        if cfg.norm_placement == "output"
        else ("input_layernorm", "post_attention_layernorm")
    )
    for i in range(cfg.n_layers):
        s, p = f"model.layers.{i}", f"blocks.{i}"
        a = f"{s}.self_attn"
        out += [
            same(f"{s}.{norms[0]}.weight", f"{p}.ln1.w"),
            same(f"{s}.{norms[1]}.weight", f"{p}.ln2.w"),
            same(f"{a}.q_norm.weight", f"{p}.attn.q_norm"),
            same(f"{a}.k_norm.weight", f"{p}.attn.k_norm"),
        ]
        out += _attn_linear(cfg, f"{p}.attn", f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj", f"{a}.o_proj")
        m = f"{s}.mlp"
        if cfg.experts:
            q, E = f"{p}.moe", range(cfg.experts)
            out += [
                linear(f"{m}.gate.weight", f"{q}.W_router"),
                experts(tuple(f"{m}.experts.{e}.gate_proj.weight" for e in E), f"{q}.W_gate"),
                experts(tuple(f"{m}.experts.{e}.up_proj.weight" for e in E), f"{q}.W_in"),
                experts(tuple(f"{m}.experts.{e}.down_proj.weight" for e in E), f"{q}.W_out"),
            ]
            continue
        q = f"{p}.mlp"
        out += [
            linear(f"{m}.gate_proj.weight", f"{q}.W_gate"),
            linear(f"{m}.up_proj.weight", f"{q}.W_in"),
            linear(f"{m}.down_proj.weight", f"{q}.W_out"),
        ]
    return out + llama_final_links(cfg)


QK_NORM_ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch(
            "Qwen3ForCausalLM",
            qk_norm_config,
            qk_norm_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
        ),
        Arch(
            "Qwen3MoeForCausalLM",
            qk_norm_config,
            qk_norm_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
            expert_files=("mlp.", "gate_proj", "up_proj", "down_proj"),
        ),
        Arch(
            "Olmo2ForCausalLM",
            qk_norm_config,
            qk_norm_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
        ),
    )
}
