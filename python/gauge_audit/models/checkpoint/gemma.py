"""Gemma 2 / Gemma 3 checkpoints ↔ the project's layout: Hugging Face ``Gemma2ForCausalLM``,
``Gemma3ForCausalLM`` (``Gemma3TextConfig``), the text part of ``Gemma3ForConditionalGeneration``,
and llama.cpp's ``gemma3`` GGUF.

Norm weights.  transformers' Gemma norms compute n(x)·(1 + w) and store w; the project holds
γ = 1 + w (see models/gemma.py), so the Hugging Face links add 1 on reading and subtract it on
writing.  llama.cpp's converter folds the 1 in (``Gemma3Model.norm_shift = 1.0`` in
convert_hf_to_gguf.py: every ``*norm.weight`` is stored as w + 1, the query/key norms included),
so a GGUF's norm weights are γ as they are; ``tests/test_family_gemma.py`` shows on the real
Gemma 3 270M file that reading them as w (adding 1 again) destroys the model's predictions.
llama.cpp rotates Gemma's queries and keys with the half-split pairing (NeoX style), so — unlike
its llama files — the Q/K rows are stored unpermuted.
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import GaugeAuditError
from .. import gemma
from ..config import Config
from .hf import Link, _act, _common, _float, _heads, _int, linear, linear_heads, linear_out_heads, refuse, same

CAUSAL = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
SOFT_CAPPED = "Gemma2ForCausalLM"  # attention scores soft-capped (Gemma 3 dropped it)
MULTIMODAL = "Gemma3ForConditionalGeneration"


def offset_norm(f: str, p: str) -> Link:
    """A (1 + w) norm weight w (file) ↔ γ = 1 + w (project)."""
    return Link((f,), (p,), lambda w: (w + 1,), lambda g: (g - 1,))


# ----------------------------------------------------------------------------- config.json
def _text(arch: str, hf: dict) -> dict:
    if arch != MULTIMODAL:
        return hf
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise GaugeAuditError(f"{arch}: config.json has no text_config object")
    return {"tie_word_embeddings": hf.get("tie_word_embeddings", True), **text}


def _rope(arch: str, hf: dict, gemma3: bool) -> dict:
    """rope_base, rope_local_base and rope_scale from ``rope_parameters`` (transformers ≥ 5: per
    layer type for Gemma 3) or the older rope_theta / rope_local_base_freq / rope_scaling keys."""
    rp = hf.get("rope_parameters")
    if gemma3:
        if isinstance(rp, dict) and rp:
            if not all(k in ("full_attention", "sliding_attention") for k in rp):
                raise refuse(arch, "rope_parameters", sorted(rp), "expected per-layer-type RoPE parameters")
            full, local = dict(rp.get("full_attention") or {}), dict(rp.get("sliding_attention") or {})
        else:
            full = dict(hf.get("rope_scaling") or {})
            full.setdefault("rope_theta", hf.get("rope_theta", 1e6))
            local = {"rope_theta": hf.get("rope_local_base_freq", 1e4)}
        full.setdefault("rope_theta", 1e6)
        local.setdefault("rope_theta", 1e4)
    else:
        full = (
            dict(rp)
            if isinstance(rp, dict) and rp
            else {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1e4)}
        )
        full.setdefault("rope_theta", 1e4)
        local = {"rope_theta": full["rope_theta"]}
    kind = full.get("rope_type", full.get("type", "default"))
    if kind not in ("default", "linear"):
        raise refuse(
            arch,
            "rope_parameters.full_attention.rope_type",
            kind,
            "only default and linear RoPE scaling are read for Gemma",
        )
    scale = _float(arch, full, "factor", 1.0) if kind == "linear" else 1.0
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise refuse(
            arch,
            "rope_parameters.sliding_attention.rope_type",
            local.get("rope_type"),
            "RoPE scaling on the sliding layers",
        )
    for key in ("partial_rotary_factor",):
        if full.get(key, 1.0) != 1.0 or hf.get(key, 1.0) != 1.0:
            raise refuse(arch, key, full.get(key, hf.get(key)), "the family rotates the whole head")
    return {
        "rope_base": _float(arch, full, "rope_theta"),
        "rope_local_base": _float(arch, local, "rope_theta"),
        "rope_scale": scale,
    }


def _layer_types(arch: str, hf: dict, n: int, pattern: int) -> tuple:
    types = hf.get("layer_types")
    if types is None:
        return tuple(gemma.SLIDING if (i + 1) % pattern else gemma.FULL for i in range(n))
    names = {"sliding_attention": gemma.SLIDING, "full_attention": gemma.FULL}
    if not isinstance(types, list) or len(types) != n or any(t not in names for t in types):
        raise refuse(arch, "layer_types", types, f"expected {n} entries, each sliding_attention or full_attention")
    return tuple(names[t] for t in types)


def gemma_config(arch: str, hf: dict) -> Config:
    g3 = arch != "Gemma2ForCausalLM"
    hf = _text(arch, hf)
    _common(arch, hf)
    for key, why in (
        ("attention_bias", "biases on the attention projections"),
        ("use_bidirectional_attention", "bidirectional attention"),
    ):
        if hf.get(key):
            raise refuse(arch, key, hf[key], f"{why} are not part of the gemma family")
    if g3 and hf.get("attn_logit_softcapping") is not None:
        raise refuse(
            arch,
            "attn_logit_softcapping",
            hf["attn_logit_softcapping"],
            "transformers' Gemma 3 attention does not apply it (ambiguous)",
        )
    if arch == MULTIMODAL and hf.get("final_logit_softcapping") is not None:
        raise refuse(
            arch,
            "text_config.final_logit_softcapping",
            hf["final_logit_softcapping"],
            "transformers' Gemma3ForConditionalGeneration does not apply it (ambiguous)",
        )
    act = _act(arch, hf, "hidden_activation", "gelu_pytorch_tanh", ("gelu-tanh", "gelu"))
    d, h = _int(arch, hf, "hidden_size", 2304), _int(arch, hf, "num_attention_heads", 8)
    n = _int(arch, hf, "num_hidden_layers", 26)
    e = _heads(arch, {"head_dim": hf.get("head_dim", 256)}, d, h)
    pattern = _int(arch, hf, "sliding_window_pattern", 6 if g3 else 2)
    types = _layer_types(arch, hf, n, pattern)
    window = hf.get("sliding_window", 4096)
    if window is None and gemma.SLIDING in types:
        raise refuse(arch, "sliding_window", None, "sliding layers without a window")
    window = 0 if window is None else _int(arch, hf, "sliding_window")
    caps = {}
    for key, ours in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "final_softcap")):
        default = (50.0 if key.startswith("attn") else 30.0) if not g3 else None
        v = hf.get(key, default)
        caps[ours] = 0.0 if v is None else _float(arch, {key: v}, key)
        if v is not None and caps[ours] == 0:
            raise refuse(arch, key, v, "a soft-cap of 0")
    cfg = gemma.config(
        d_model=d,
        n_layers=n,
        n_heads=h,
        n_kv_heads=_int(arch, hf, "num_key_value_heads", h),
        d_head=e,
        d_ff=_int(arch, hf, "intermediate_size", 9216),
        n_ctx=_int(arch, hf, "max_position_embeddings", 8192),
        vocab=_int(arch, hf, "vocab_size"),
        norm_eps=_float(arch, hf, "rms_norm_eps", 1e-6),
        tied=bool(hf.get("tie_word_embeddings", True)),
        qk_norm="head" if g3 else "none",
        gate_act=act,
        query_pre_attn_scalar=_float(arch, hf, "query_pre_attn_scalar", 256),
        window=window,
        sliding_pattern=0,
        layer_types=types,
        **caps,
        **_rope(arch, hf, g3),
    )
    return cfg


# ----------------------------------------------------------------------------- links
def _prefix(arch: str, has: Callable[[str], bool]) -> str:
    if arch != MULTIMODAL:
        return "model."
    # the original uploads and transformers' save_pretrained write language_model.model.* (head
    # language_model.lm_head); transformers' in-memory names, model.language_model.*, are read too
    return "model.language_model." if has("model.language_model.embed_tokens.weight") else "language_model.model."


def links_for(arch: str) -> Callable[[Config, Callable[[str], bool]], list[Link]]:
    def links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
        m = _prefix(arch, has)
        out = [same(f"{m}embed_tokens.weight", "embed.W_E")]
        for i in range(cfg.n_layers):
            s, p = f"{m}layers.{i}", f"blocks.{i}"
            a = f"{s}.self_attn"
            out += [
                offset_norm(f"{s}.input_layernorm.weight", f"{p}.ln1.w"),
                offset_norm(f"{s}.post_attention_layernorm.weight", f"{p}.ln1_post.w"),
                offset_norm(f"{s}.pre_feedforward_layernorm.weight", f"{p}.ln2.w"),
                offset_norm(f"{s}.post_feedforward_layernorm.weight", f"{p}.ln2_post.w"),
                linear_heads(f"{a}.q_proj.weight", f"{p}.attn.W_Q", cfg.n_heads),
                linear_heads(f"{a}.k_proj.weight", f"{p}.attn.W_K", cfg.n_kv_heads),
                linear_heads(f"{a}.v_proj.weight", f"{p}.attn.W_V", cfg.n_kv_heads),
                linear_out_heads(f"{a}.o_proj.weight", f"{p}.attn.W_O", cfg.n_heads),
                linear(f"{s}.mlp.gate_proj.weight", f"{p}.mlp.W_gate"),
                linear(f"{s}.mlp.up_proj.weight", f"{p}.mlp.W_in"),
                linear(f"{s}.mlp.down_proj.weight", f"{p}.mlp.W_out"),
            ]
            if cfg.qk_norm == "head":
                out += [
                    offset_norm(f"{a}.q_norm.weight", f"{p}.attn.q_norm"),
                    offset_norm(f"{a}.k_norm.weight", f"{p}.attn.k_norm"),
                ]
        out.append(offset_norm(f"{m}norm.weight", "ln_final.w"))
        if not cfg.tied:
            head = "language_model.lm_head.weight" if m == "language_model.model." else "lm_head.weight"
            out.append(linear(head, "unembed.W_U"))
        return out

    return links


# ----------------------------------------------------------------------------- GGUF (llama.cpp's gemma3)
def gguf_hf_config(g, short) -> dict:
    """The ``Gemma3ForCausalLM`` config.json a gemma3 GGUF describes.  llama.cpp fixes three
    things the metadata does not carry (llama-model.cpp, LLM_ARCH_GEMMA3): every 6th layer is
    full attention, the sliding layers' RoPE base is 10 000, and the score scale is
    1/√key_length except for the 27B shape (62 layers), where it is 1/√(d_model/heads)."""

    def key(k, default=None):
        return g.field(f"gemma3.{k}", default)

    for k, why in (
        ("expert_count", "mixture of experts"),
        ("attn_logit_softcapping", "attention soft-capping"),
        ("final_logit_softcapping", "final-logit soft-capping"),
    ):
        v = key(k)
        if v not in (None, 0, 0.0):
            raise GaugeAuditError(f"{g.path}: unsupported GGUF option gemma3.{k}={v!r}: {why}")
    d, h, n = int(key("embedding_length")), int(key("attention.head_count")), int(key("block_count"))
    e = int(key("attention.key_length", 256))
    if int(key("attention.value_length", e)) != e:
        raise GaugeAuditError(f"{g.path}: unsupported GGUF option: key_length {e} ≠ value_length")
    full = {"rope_type": "default", "rope_theta": short(key("rope.freq_base", 1e6))}
    kind = key("rope.scaling.type")
    if kind not in (None, "none", "linear"):
        raise GaugeAuditError(f"{g.path}: unsupported GGUF option gemma3.rope.scaling.type={kind!r}")
    if kind == "linear" and short(key("rope.scaling.factor", 1.0)) != 1.0:
        full.update(rope_type="linear", factor=short(key("rope.scaling.factor")))
    vocab = key("vocab_size") or g.entries["token_embd.weight"][1][0]
    hf = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": d,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": n,
        "num_attention_heads": h,
        "num_key_value_heads": int(key("attention.head_count_kv", h)),
        "head_dim": e,
        "rms_norm_eps": short(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "sliding_window": int(key("attention.sliding_window", 4096)),
        "layer_types": ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)],
        "query_pre_attn_scalar": d // h if n == 62 else e,
        "max_position_embeddings": int(key("context_length", 131072)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "attention_bias": False,
        "dtype": "float32",
    }
    for name, k in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        v = g.field(f"tokenizer.ggml.{k}")
        if v is not None:
            hf[name] = int(v)
    return hf
