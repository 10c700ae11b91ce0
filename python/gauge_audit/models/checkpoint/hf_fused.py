"""Hugging Face architectures whose files fuse projections: Phi-3 (``qkv_proj`` (h·e + 2·kv·e, d)
= [Q | K | V] rows, ``gate_up_proj`` (2f, d) = [gate | up] rows; partial rotary and longrope read).
Config reading and links in the style of :mod:`.hf`, whose helpers they use."""

from __future__ import annotations

from typing import Callable

import torch

from .. import phi3
from ..config import Config
from .hf import _LLAMA_IGNORE, Arch, Link, _act, _common, _float, _heads, _int, _rope, _window, \
    linear, linear_out_heads, same


def fused_qkv(f: str, ps: tuple[str, str, str], h: int, kv: int, e: int) -> Link:
    """qkv_proj.weight (h·e + 2·kv·e, d) ↔ W_Q (h, d, e), W_K (kv, d, e), W_V (kv, d, e)."""
    sizes = (h * e, kv * e, kv * e)

    def read(w):
        return tuple(x.T.reshape(w.shape[1], n, e).permute(1, 0, 2)
                     for x, n in zip(w.split(sizes, dim=0), (h, kv, kv)))

    def write(*ws):
        return (torch.cat([w.permute(1, 0, 2).reshape(w.shape[1], -1).T for w in ws], dim=0),)
    return Link((f,), ps, read, write)


def fused_gate_up_linear(f: str, ps: tuple[str, str]) -> Link:
    """gate_up_proj.weight (2f, d) = [gate | up] ↔ W_gate, W_in (d, f)."""
    return Link((f,), ps, lambda w: tuple(x.T for x in w.chunk(2, dim=0)),
                lambda g, u: (torch.cat([g.T, u.T], dim=0),))


def phi3_config(arch: str, hf: dict) -> Config:
    _common(arch, hf)
    _act(arch, hf, "hidden_act", "silu", ("silu",))
    d, h = _int(arch, hf, "hidden_size"), _int(arch, hf, "num_attention_heads")
    kv = _int(arch, hf, "num_key_value_heads", h) if hf.get("num_key_value_heads") is not None else h
    return phi3.config(d_model=d, n_layers=_int(arch, hf, "num_hidden_layers"), n_heads=h, n_kv_heads=kv,
                       d_head=_heads(arch, hf, d, h), d_ff=_int(arch, hf, "intermediate_size"),
                       n_ctx=_int(arch, hf, "max_position_embeddings", 4096), vocab=_int(arch, hf, "vocab_size"),
                       norm_eps=_float(arch, hf, "rms_norm_eps", 1e-5), **_rope(arch, hf, rotary_ok=True),
                       window=_window(arch, hf, always=True), tied=bool(hf.get("tie_word_embeddings", False)))


def phi3_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    out = [same("model.embed_tokens.weight", "embed.W_E")]
    for i in range(cfg.n_layers):
        s, p = f"model.layers.{i}", f"blocks.{i}"
        out += [same(f"{s}.input_layernorm.weight", f"{p}.ln1.w"),
                same(f"{s}.post_attention_layernorm.weight", f"{p}.ln2.w"),
                fused_qkv(f"{s}.self_attn.qkv_proj.weight", (f"{p}.attn.W_Q", f"{p}.attn.W_K", f"{p}.attn.W_V"),
                          cfg.n_heads, cfg.n_kv_heads, cfg.d_head),
                linear_out_heads(f"{s}.self_attn.o_proj.weight", f"{p}.attn.W_O", cfg.n_heads),
                fused_gate_up_linear(f"{s}.mlp.gate_up_proj.weight", (f"{p}.mlp.W_gate", f"{p}.mlp.W_in")),
                linear(f"{s}.mlp.down_proj.weight", f"{p}.mlp.W_out")]
    out.append(same("model.norm.weight", "ln_final.w"))
    if not cfg.tied:
        out.append(linear("lm_head.weight", "unembed.W_U"))
    return out


FUSED_ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("Phi3ForCausalLM", phi3_config, phi3_links, "model.layers", "model.layers.{i}.", "AutoModelForCausalLM",
         ignore=_LLAMA_IGNORE),
)}
