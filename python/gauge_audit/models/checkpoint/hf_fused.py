"""Hugging Face architectures whose files fuse projections: Phi-3 (``qkv_proj`` (h·e + 2·kv·e, d)
= [Q | K | V] rows, ``gate_up_proj`` (2f, d) = [gate | up] rows; partial rotary and longrope read) and
GPT-NeoX / Pythia (``query_key_value`` (3·h·e, d) interleaved per head: rows h·3e … = [q_h | k_h | v_h];
parallel residual, partial rotary).
Config reading and links in the style of :mod:`.hf`, whose helpers they use."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import neox, phi3
from ..config import Config
from .hf import (
    _LLAMA_IGNORE,
    Arch,
    Link,
    _act,
    _common,
    _float,
    _heads,
    _int,
    _rope,
    _window,
    linear,
    linear_out_heads,
    llama_final_links,
    refuse,
    same,
)


def fused_qkv(f: str, ps: tuple[str, str, str], h: int, kv: int, e: int) -> Link:
    """qkv_proj.weight (h·e + 2·kv·e, d) ↔ W_Q (h, d, e), W_K (kv, d, e), W_V (kv, d, e)."""
    sizes = (h * e, kv * e, kv * e)

    def read(w):
        return tuple(x.T.reshape(w.shape[1], n, e).permute(1, 0, 2) for x, n in zip(w.split(sizes, dim=0), (h, kv, kv)))

    def write(*ws):
        return (torch.cat([w.permute(1, 0, 2).reshape(w.shape[1], -1).T for w in ws], dim=0),)

    return Link((f,), ps, read, write)


def fused_gate_up_linear(f: str, ps: tuple[str, str]) -> Link:
    """gate_up_proj.weight (2f, d) = [gate | up] ↔ W_gate, W_in (d, f)."""
    return Link((f,), ps, lambda w: tuple(x.T for x in w.chunk(2, dim=0)), lambda g, u: (torch.cat([g.T, u.T], dim=0),))


def neox_qkv(f: str, ps: tuple[str, str, str], h: int) -> Link:
    """query_key_value.weight (3·h·e, d), per head [q | k | v] ↔ W_Q, W_K, W_V (h, d, e); a bias (3·h·e,)
    ↔ three (h, e)."""

    def read(w):
        t = w.reshape(h, 3, -1, *w.shape[1:])  # (h, 3, e[, d])
        return tuple(t[:, i].transpose(1, 2) if w.dim() == 2 else t[:, i] for i in range(3))

    def write(*ws):
        parts = [x.transpose(1, 2) if x.dim() == 3 else x for x in ws]  # (h, e[, d])
        t = torch.stack(parts, dim=1)
        return (t.reshape(-1, *t.shape[3:]),)

    return Link((f,), ps, read, write)


def neox_config(arch: str, hf: dict) -> Config:
    _common(arch, {k: v for k, v in hf.items() if k != "use_parallel_residual"})
    act = _act(arch, hf, "hidden_act", "gelu", ("gelu", "gelu-tanh", "relu", "silu"))
    d, h = _int(arch, hf, "hidden_size"), _int(arch, hf, "num_attention_heads")
    if d % h:
        raise refuse(arch, "num_attention_heads", h, f"does not divide hidden_size {d}")
    rope = _rope(arch, hf, rotary_ok=True)
    bias = bool(hf.get("attention_bias", True))
    return neox.config(
        d_model=d,
        n_layers=_int(arch, hf, "num_hidden_layers"),
        n_heads=h,
        n_kv_heads=h,
        d_head=d // h,
        d_ff=_int(arch, hf, "intermediate_size"),
        n_ctx=_int(arch, hf, "max_position_embeddings", 2048),
        vocab=_int(arch, hf, "vocab_size"),
        norm_eps=_float(arch, hf, "layer_norm_eps", 1e-5),
        act=act,
        **rope,
        parallel_residual=bool(hf.get("use_parallel_residual", True)),
        attn_bias=bias,
        out_bias=bias,
        tied=bool(hf.get("tie_word_embeddings", False)),
    )


def neox_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    out = [same("gpt_neox.embed_in.weight", "embed.W_E")]
    for i in range(cfg.n_layers):
        s, p = f"gpt_neox.layers.{i}", f"blocks.{i}"
        out += [
            same(f"{s}.input_layernorm.weight", f"{p}.ln1.w"),
            same(f"{s}.input_layernorm.bias", f"{p}.ln1.b"),
            same(f"{s}.post_attention_layernorm.weight", f"{p}.ln2.w"),
            same(f"{s}.post_attention_layernorm.bias", f"{p}.ln2.b"),
            neox_qkv(
                f"{s}.attention.query_key_value.weight",
                (f"{p}.attn.W_Q", f"{p}.attn.W_K", f"{p}.attn.W_V"),
                cfg.n_heads,
            ),
            linear_out_heads(f"{s}.attention.dense.weight", f"{p}.attn.W_O", cfg.n_heads),
            linear(f"{s}.mlp.dense_h_to_4h.weight", f"{p}.mlp.W_in"),
            same(f"{s}.mlp.dense_h_to_4h.bias", f"{p}.mlp.b_in"),
            linear(f"{s}.mlp.dense_4h_to_h.weight", f"{p}.mlp.W_out"),
            same(f"{s}.mlp.dense_4h_to_h.bias", f"{p}.mlp.b_out"),
        ]
        if cfg.attn_bias:
            out += [
                neox_qkv(
                    f"{s}.attention.query_key_value.bias",
                    (f"{p}.attn.b_Q", f"{p}.attn.b_K", f"{p}.attn.b_V"),
                    cfg.n_heads,
                ),
                same(f"{s}.attention.dense.bias", f"{p}.attn.b_O"),
            ]
    out += [
        same("gpt_neox.final_layer_norm.weight", "ln_final.w"),
        same("gpt_neox.final_layer_norm.bias", "ln_final.b"),
    ]
    if not cfg.tied:
        out.append(linear("embed_out.weight" if has("embed_out.weight") else "lm_head.weight", "unembed.W_U"))
    return out


def phi3_config(arch: str, hf: dict) -> Config:
    _common(arch, hf)
    _act(arch, hf, "hidden_act", "silu", ("silu",))
    d, h = _int(arch, hf, "hidden_size"), _int(arch, hf, "num_attention_heads")
    kv = _int(arch, hf, "num_key_value_heads", h) if hf.get("num_key_value_heads") is not None else h
    return phi3.config(
        d_model=d,
        n_layers=_int(arch, hf, "num_hidden_layers"),
        n_heads=h,
        n_kv_heads=kv,
        d_head=_heads(arch, hf, d, h),
        d_ff=_int(arch, hf, "intermediate_size"),
        n_ctx=_int(arch, hf, "max_position_embeddings", 4096),
        vocab=_int(arch, hf, "vocab_size"),
        norm_eps=_float(arch, hf, "rms_norm_eps", 1e-5),
        **_rope(arch, hf, rotary_ok=True),
        window=_window(arch, hf, always=True),
        tied=bool(hf.get("tie_word_embeddings", False)),
    )


def phi3_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    out = [same("model.embed_tokens.weight", "embed.W_E")]
    for i in range(cfg.n_layers):
        s, p = f"model.layers.{i}", f"blocks.{i}"
        out += [
            same(f"{s}.input_layernorm.weight", f"{p}.ln1.w"),
            same(f"{s}.post_attention_layernorm.weight", f"{p}.ln2.w"),
            fused_qkv(
                f"{s}.self_attn.qkv_proj.weight",
                (f"{p}.attn.W_Q", f"{p}.attn.W_K", f"{p}.attn.W_V"),
                cfg.n_heads,
                cfg.n_kv_heads,
                cfg.d_head,
            ),
            linear_out_heads(f"{s}.self_attn.o_proj.weight", f"{p}.attn.W_O", cfg.n_heads),
            fused_gate_up_linear(f"{s}.mlp.gate_up_proj.weight", (f"{p}.mlp.W_gate", f"{p}.mlp.W_in")),
            linear(f"{s}.mlp.down_proj.weight", f"{p}.mlp.W_out"),
        ]
    return out + llama_final_links(cfg)


FUSED_ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch(
            "Phi3ForCausalLM",
            phi3_config,
            phi3_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
        ),
        Arch(
            "GPTNeoXForCausalLM",
            neox_config,
            neox_links,
            "gpt_neox.layers",
            "gpt_neox.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=r".*(rotary_emb\.inv_freq|attention\.(masked_)?bias)$",
        ),
    )
}
