"""Hugging Face checkpoints ↔ the project's layout, one architecture at a time.

For each supported architecture: how ``config.json`` becomes a :class:`Config` (every option
that changes the function is read; every option the families cannot represent is refused with
one line naming it), and the :class:`Link` list that maps the file's tensors to the project's
per-head tensors and back.

Conventions on the file side (checked against transformers' modules by the tests):

* ``nn.Linear`` stores ``weight (out, in)`` with ``y = x·Wᵀ + b``; per-head projections put
  head ``h``'s outputs in rows ``h·e … h·e+e−1`` (``q_proj``, ``k_proj``, ``v_proj``) and
  ``o_proj`` reads head ``h`` from columns ``h·e …``.
* GPT-2's ``Conv1D`` stores ``weight (in, out)`` with ``y = x·W + b``; ``c_attn`` fuses
  ``[Q | K | V]`` along the output axis.
* LLaMA-family RoPE is the half-split pairing (i, i + e/2) — the project's ``rope_style="half"``.
* Mixtral experts: ``w1`` = gate, ``w3`` = up, ``w2`` = down, per expert (transformers' fused
  ``gate_up_proj = [gate | up]`` / ``down_proj`` are read too); the router ``gate.weight (E, d)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...errors import GaugeAuditError
from .. import bert, gpt2, llama, moe, qwen
from ..config import Config
from ..rope import ROPE_TYPES, scaling_problem


# ----------------------------------------------------------------------------- links
@dataclass(frozen=True)
class Link:
    """File tensors ↔ project tensors: ``read(*file) -> project tuple``, ``write(*project) -> file tuple``."""

    files: tuple[str, ...]
    params: tuple[str, ...]
    read: Callable[..., tuple]
    write: Callable[..., tuple] | None = None


def same(f: str, p: str) -> Link:
    return Link((f,), (p,), lambda t: (t,), lambda t: (t,))


def linear(f: str, p: str) -> Link:
    """nn.Linear (out, in) ↔ the project's x·W (in, out)."""
    return Link((f,), (p,), lambda w: (w.T,), lambda w: (w.T,))


def linear_heads(f: str, p: str, n: int) -> Link:
    """q/k/v_proj (n·e, d) ↔ per head (n, d, e)."""
    return Link(
        (f,),
        (p,),
        lambda w: (w.T.reshape(w.shape[1], n, -1).permute(1, 0, 2),),
        lambda w: (w.permute(1, 0, 2).reshape(w.shape[1], -1).T,),
    )


def linear_out_heads(f: str, p: str, n: int) -> Link:
    """o_proj (d, n·e) ↔ per head (n, e, d)."""
    return Link((f,), (p,), lambda w: (w.T.reshape(n, -1, w.shape[0]),), lambda w: (w.reshape(-1, w.shape[2]).T,))


def bias_heads(f: str, p: str, n: int) -> Link:
    return Link((f,), (p,), lambda b: (b.reshape(n, -1),), lambda b: (b.reshape(-1),))


def conv1d_qkv(f: str, ps: tuple[str, str, str], n: int) -> Link:
    """GPT-2 c_attn.weight (d, 3·n·e) = [W_Q | W_K | W_V] ↔ three (n, d, e)."""

    def read(w):
        return tuple(x.reshape(w.shape[0], n, -1).permute(1, 0, 2) for x in w.chunk(3, dim=1))

    def write(*ws):
        return (torch.cat([w.permute(1, 0, 2).reshape(w.shape[1], -1) for w in ws], dim=1),)

    return Link((f,), ps, read, write)


def conv1d_qkv_bias(f: str, ps: tuple[str, str, str], n: int) -> Link:
    return Link(
        (f,),
        ps,
        lambda b: tuple(x.reshape(n, -1) for x in b.chunk(3)),
        lambda *bs: (torch.cat([b.reshape(-1) for b in bs]),),
    )


def conv1d_out_heads(f: str, p: str, n: int) -> Link:
    """GPT-2 attn.c_proj.weight (n·e, d) ↔ (n, e, d)."""
    return Link((f,), (p,), lambda w: (w.reshape(n, -1, w.shape[1]),), lambda w: (w.reshape(-1, w.shape[2]),))


def experts(fs: tuple[str, ...], p: str) -> Link:
    """E per-expert nn.Linear weights ↔ one stacked (E, in, out)."""
    return Link(
        fs, (p,), lambda *ws: (torch.stack([w.T for w in ws]),), lambda w: tuple(w[e].T for e in range(w.shape[0]))
    )


def fused_gate_up(f: str, ps: tuple[str, str]) -> Link:
    """transformers ≥ 5 Mixtral experts.gate_up_proj (E, 2f, d) = [gate | up] ↔ W_gate, W_in (E, d, f)."""
    return Link(
        (f,),
        ps,
        lambda w: tuple(x.transpose(1, 2) for x in w.chunk(2, dim=1)),
        lambda g, u: (torch.cat([g.transpose(1, 2), u.transpose(1, 2)], dim=1),),
    )


def fused_down(f: str, p: str) -> Link:
    return Link((f,), (p,), lambda w: (w.transpose(1, 2),), lambda w: (w.transpose(1, 2),))


# ----------------------------------------------------------------------------- config reading
def refuse(arch: str, option: str, value, why: str) -> GaugeAuditError:
    return GaugeAuditError(f"{arch}: unsupported option {option}={value!r}: {why}")


# Options of other architectures that would change the function if a config carried them.
_FOREIGN = {
    "alibi": "ALiBi position biases",
    "use_alibi": "ALiBi position biases",
    "parallel_attn": "parallel attention/MLP residual",
    "use_parallel_residual": "parallel residual",
    "parallel_residual": "parallel residual",
    "new_decoder_architecture": "Falcon's parallel decoder",
    "quantization_config": "quantized weights (dequantize to float first)",
}

_HF_ACTS = {
    "gelu": "gelu",
    "gelu_new": "gelu-tanh",
    "gelu_pytorch_tanh": "gelu-tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def _common(arch: str, hf: dict) -> None:
    for key, why in _FOREIGN.items():
        if hf.get(key):
            raise refuse(arch, key, hf[key], f"{why} cannot be represented by the project's families")
    for key in ("is_decoder", "add_cross_attention", "is_encoder_decoder"):
        if hf.get(key):
            raise refuse(arch, key, hf[key], "cross-attention / decoder variants are not part of the families")


def _act(arch: str, hf: dict, key: str, default: str, allowed: tuple[str, ...]) -> str:
    name = hf.get(key, default)
    ours = _HF_ACTS.get(name) if isinstance(name, str) else None
    if ours not in allowed:
        raise refuse(
            arch,
            key,
            name,
            f"unknown activation for this architecture (supported: "
            f"{', '.join(k for k, v in _HF_ACTS.items() if v in allowed)})",
        )
    return ours


def _int(arch: str, hf: dict, key: str, default=None) -> int:
    v = hf.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise GaugeAuditError(f"{arch}: config.json option {key} must be a positive integer, got {v!r}")
    return v


def _float(arch: str, hf: dict, key: str, default=None) -> float:
    v = hf.get(key, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v == v or v < 0:
        raise GaugeAuditError(f"{arch}: config.json option {key} must be a non-negative number, got {v!r}")
    return float(v)


def _heads(arch: str, hf: dict, d: int, h: int) -> int:
    e = hf.get("head_dim") or (d // h if d % h == 0 else None)
    if e is None:
        raise GaugeAuditError(f"{arch}: hidden size {d} is not divisible by {h} heads and no head_dim is given")
    return _int(arch, {"head_dim": e}, "head_dim")


def _rope(arch: str, hf: dict, rotary_ok: bool = False) -> dict:
    """RoPE base, scaling type and its options (models/rope.py), and the rotated width of a head."""
    rp = hf.get("rope_parameters")
    if isinstance(rp, dict) and rp:
        if "rope_type" not in rp and all(isinstance(v, dict) for v in rp.values()):
            raise refuse(arch, "rope_parameters", sorted(rp), "per-layer-type RoPE parameters")
        where, scaling = "rope_parameters", dict(rp)
        theta = rp.get("rope_theta", hf.get("rope_theta", 10000.0))
        partial = rp.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    else:
        where, scaling = "rope_scaling", hf.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            raise refuse(arch, "rope_scaling", scaling, "not a dictionary of RoPE scaling options")
        scaling = dict(scaling)
        theta = hf.get("rope_theta", 10000.0)
        partial = hf.get("partial_rotary_factor", 1.0)
    kind = scaling.pop("rope_type", scaling.pop("type", "default"))
    for key in ("rope_theta", "partial_rotary_factor"):
        scaling.pop(key, None)
    if (
        kind == "longrope"
        and "original_max_position_embeddings" not in scaling
        and "original_max_position_embeddings" in hf
    ):  # Phi-3 keeps it at the top level
        scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    if kind not in ROPE_TYPES:
        raise refuse(arch, f"{where}.rope_type", kind, f"unknown RoPE scaling (supported: {', '.join(ROPE_TYPES)})")
    params: list[tuple[str, float | tuple[float, ...]]] = []
    for key, v in sorted(scaling.items()):
        if v is None:
            continue
        if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            params.append((key, tuple(float(x) for x in v)))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, bool) and key == "truncate":
            params.append((key, float(v)))
        else:
            raise refuse(arch, f"{where}.{key}", v, "not a number")
    d_head = _heads(arch, hf, _int(arch, hf, "hidden_size"), _int(arch, hf, "num_attention_heads"))
    if not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise refuse(arch, "partial_rotary_factor", partial, "must be in (0, 1]")
    rotary = int(d_head * partial)
    if rotary != d_head and not rotary_ok:
        raise refuse(arch, "partial_rotary_factor", partial, "the family rotates the whole head")
    problem = scaling_problem(kind, tuple(params), rotary)
    if problem:
        raise refuse(arch, where, kind, problem)
    return dict(
        rope_base=_float(arch, {"rope_theta": theta}, "rope_theta"),
        rope_type=kind,
        rope_params=tuple(params),
        rotary_dim=0 if rotary == d_head else rotary,
    )


def _window(arch: str, hf: dict, always: bool) -> int:
    """Mistral/Mixtral use sliding_window whenever it is set (every layer the same window); Qwen2 only
    with use_sliding_window, and then on some layers only, which the family cannot represent."""
    window = hf.get("sliding_window")
    types = hf.get("layer_types") or []
    if "sliding_attention" in types and not always:
        raise refuse(arch, "layer_types", "sliding_attention", "per-layer sliding-window attention")
    if window is None or not (always or hf.get("use_sliding_window")):
        return 0
    if not always:
        raise refuse(arch, "sliding_window", window, "sliding-window attention on some layers only")
    return _int(arch, hf, "sliding_window")


def gpt2_config(arch: str, hf: dict) -> Config:
    _common(arch, hf)
    if hf.get("scale_attn_weights", True) is not True:
        raise refuse(arch, "scale_attn_weights", hf["scale_attn_weights"], "scores without the 1/√d_head factor")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        raise refuse(arch, "scale_attn_by_inverse_layer_idx", True, "per-layer score scaling")
    d, h = _int(arch, hf, "n_embd"), _int(arch, hf, "n_head")
    if d % h:
        raise GaugeAuditError(f"{arch}: n_embd {d} is not divisible by n_head {h}")
    lm = arch == "GPT2LMHeadModel"
    return gpt2.config(
        d_model=d,
        n_layers=_int(arch, hf, "n_layer"),
        n_heads=h,
        n_kv_heads=h,
        d_head=d // h,
        d_ff=hf.get("n_inner") or 4 * d,
        n_ctx=_int(arch, hf, "n_positions"),
        vocab=_int(arch, hf, "vocab_size"),
        norm_eps=_float(arch, hf, "layer_norm_epsilon", 1e-5),
        act=_act(arch, hf, "activation_function", "gelu_new", ("gelu", "gelu-tanh", "relu", "silu")),
        tied=lm and bool(hf.get("tie_word_embeddings", True)),
        unembed=lm,
    )


def bert_config(arch: str, hf: dict) -> Config:
    _common(arch, hf)
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise refuse(arch, "position_embedding_type", kind, "relative position embeddings")
    d, h = _int(arch, hf, "hidden_size"), _int(arch, hf, "num_attention_heads")
    e = _heads(arch, {}, d, h)
    return bert.config(
        d_model=d,
        n_layers=_int(arch, hf, "num_hidden_layers"),
        n_heads=h,
        n_kv_heads=h,
        d_head=e,
        d_ff=_int(arch, hf, "intermediate_size"),
        n_ctx=_int(arch, hf, "max_position_embeddings"),
        vocab=_int(arch, hf, "vocab_size"),
        n_types=_int(arch, hf, "type_vocab_size", 2),
        norm_eps=_float(arch, hf, "layer_norm_eps", 1e-12),
        act=_act(arch, hf, "hidden_act", "gelu", ("gelu", "gelu-tanh", "relu", "silu")),
    )


def llama_like_config(arch: str, hf: dict) -> Config:
    """LLaMA, Mistral, Qwen2 and Mixtral: RMSNorm, half-split RoPE, GQA, SwiGLU."""
    _common(arch, hf)
    window = _window(arch, hf, always=arch in ("MistralForCausalLM", "MixtralForCausalLM"))
    _act(arch, hf, "hidden_act", "silu", ("silu",))  # SwiGLU's gate activation
    d, h = _int(arch, hf, "hidden_size"), _int(arch, hf, "num_attention_heads")
    kv = _int(arch, hf, "num_key_value_heads", h) if hf.get("num_key_value_heads") is not None else h
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
        rope_style="half",
        tied=bool(hf.get("tie_word_embeddings", False)),
        window=window,
    )
    if arch == "Qwen2ForCausalLM":
        return qwen.config(**common, attn_bias=True, out_bias=False)
    if arch == "MixtralForCausalLM":
        return moe.config(
            **common, experts=_int(arch, hf, "num_local_experts"), top_k=_int(arch, hf, "num_experts_per_tok")
        )
    bias = bool(hf.get("attention_bias", False))
    return llama.config(**common, attn_bias=bias, out_bias=bias, mlp_bias=bool(hf.get("mlp_bias", False)))


# ----------------------------------------------------------------------------- links per architecture
def _attn_linear(cfg: Config, dst: str, q: str, k: str, v: str, o: str) -> list[Link]:
    """nn.Linear projections named ``q``, ``k``, ``v``, ``o`` (file prefixes) ↔ the per-head tensors."""
    h, kv = cfg.n_heads, cfg.n_kv_heads
    out = [
        linear_heads(f"{q}.weight", f"{dst}.W_Q", h),
        linear_heads(f"{k}.weight", f"{dst}.W_K", kv),
        linear_heads(f"{v}.weight", f"{dst}.W_V", kv),
        linear_out_heads(f"{o}.weight", f"{dst}.W_O", h),
    ]
    if cfg.attn_bias:
        out += [
            bias_heads(f"{q}.bias", f"{dst}.b_Q", h),
            bias_heads(f"{k}.bias", f"{dst}.b_K", kv),
            bias_heads(f"{v}.bias", f"{dst}.b_V", kv),
        ]
    if cfg.out_bias:
        out.append(same(f"{o}.bias", f"{dst}.b_O"))
    return out


def _norm(cfg: Config, src: str, dst: str, w="weight", b="bias") -> list[Link]:
    out = [same(f"{src}.{w}", f"{dst}.w")]
    return out + [same(f"{src}.{b}", f"{dst}.b")] if cfg.norm == "layernorm" else out


def gpt2_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    # GPT2LMHeadModel files put the decoder under "transformer." — except older ones (the original
    # gpt2 upload), which store it unprefixed; written files use the prefix.
    pre = "transformer." if cfg.unembed and not has("wte.weight") else ""
    h = cfg.n_heads
    out = [same(f"{pre}wte.weight", "embed.W_E"), same(f"{pre}wpe.weight", "embed.W_pos")]
    for i in range(cfg.n_layers):
        s, p = f"{pre}h.{i}", f"blocks.{i}"
        out += _norm(cfg, f"{s}.ln_1", f"{p}.ln1") + _norm(cfg, f"{s}.ln_2", f"{p}.ln2")
        out += [
            conv1d_qkv(f"{s}.attn.c_attn.weight", (f"{p}.attn.W_Q", f"{p}.attn.W_K", f"{p}.attn.W_V"), h),
            conv1d_qkv_bias(f"{s}.attn.c_attn.bias", (f"{p}.attn.b_Q", f"{p}.attn.b_K", f"{p}.attn.b_V"), h),
            conv1d_out_heads(f"{s}.attn.c_proj.weight", f"{p}.attn.W_O", h),
            same(f"{s}.attn.c_proj.bias", f"{p}.attn.b_O"),
            same(f"{s}.mlp.c_fc.weight", f"{p}.mlp.W_in"),
            same(f"{s}.mlp.c_fc.bias", f"{p}.mlp.b_in"),
            same(f"{s}.mlp.c_proj.weight", f"{p}.mlp.W_out"),
            same(f"{s}.mlp.c_proj.bias", f"{p}.mlp.b_out"),
        ]
    out += _norm(cfg, f"{pre}ln_f", "ln_final")
    if cfg.unembed and not cfg.tied:
        out.append(linear("lm_head.weight", "unembed.W_U"))
    return out


def bert_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    pre = "bert." if has("bert.embeddings.word_embeddings.weight") else ""
    e = f"{pre}embeddings"
    out = [
        same(f"{e}.word_embeddings.weight", "embed.W_E"),
        same(f"{e}.position_embeddings.weight", "embed.W_pos"),
        same(f"{e}.token_type_embeddings.weight", "embed.W_tt"),
    ] + _norm(cfg, f"{e}.LayerNorm", "embed.ln")
    for i in range(cfg.n_layers):
        s, p = f"{pre}encoder.layer.{i}", f"blocks.{i}"
        a = f"{s}.attention"
        out += _attn_linear(
            cfg, f"{p}.attn", f"{a}.self.query", f"{a}.self.key", f"{a}.self.value", f"{a}.output.dense"
        )
        out += _norm(cfg, f"{s}.attention.output.LayerNorm", f"{p}.ln1")
        out += [
            linear(f"{s}.intermediate.dense.weight", f"{p}.mlp.W_in"),
            same(f"{s}.intermediate.dense.bias", f"{p}.mlp.b_in"),
            linear(f"{s}.output.dense.weight", f"{p}.mlp.W_out"),
            same(f"{s}.output.dense.bias", f"{p}.mlp.b_out"),
        ]
        out += _norm(cfg, f"{s}.output.LayerNorm", f"{p}.ln2")
    return out


def llama_like_links(cfg: Config, has: Callable[[str], bool]) -> list[Link]:
    out = [same("model.embed_tokens.weight", "embed.W_E")]
    for i in range(cfg.n_layers):
        s, p = f"model.layers.{i}", f"blocks.{i}"
        out += [
            same(f"{s}.input_layernorm.weight", f"{p}.ln1.w"),
            same(f"{s}.post_attention_layernorm.weight", f"{p}.ln2.w"),
        ]
        a = f"{s}.self_attn"
        out += _attn_linear(cfg, f"{p}.attn", f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj", f"{a}.o_proj")
        if cfg.experts:
            out += _moe_links(cfg, s, f"{p}.moe", has)
            continue
        m, q = f"{s}.mlp", f"{p}.mlp"
        out += [
            linear(f"{m}.gate_proj.weight", f"{q}.W_gate"),
            linear(f"{m}.up_proj.weight", f"{q}.W_in"),
            linear(f"{m}.down_proj.weight", f"{q}.W_out"),
        ]
        if cfg.mlp_bias:
            out += [
                same(f"{m}.gate_proj.bias", f"{q}.b_gate"),
                same(f"{m}.up_proj.bias", f"{q}.b_in"),
                same(f"{m}.down_proj.bias", f"{q}.b_out"),
            ]
    return out + llama_final_links(cfg)


def llama_final_links(cfg: Config) -> list[Link]:
    """The final norm and, untied, the head: the same names in every llama-layout checkpoint."""
    out = [same("model.norm.weight", "ln_final.w")]
    if not cfg.tied:
        out.append(linear("lm_head.weight", "unembed.W_U"))
    return out


def _moe_links(cfg: Config, s: str, q: str, has: Callable[[str], bool]) -> list[Link]:
    if has(f"{s}.mlp.experts.gate_up_proj"):  # transformers ≥ 5's fused in-memory layout
        return [
            linear(f"{s}.mlp.gate.weight", f"{q}.W_router"),
            fused_gate_up(f"{s}.mlp.experts.gate_up_proj", (f"{q}.W_gate", f"{q}.W_in")),
            fused_down(f"{s}.mlp.experts.down_proj", f"{q}.W_out"),
        ]
    m, E = f"{s}.block_sparse_moe", range(cfg.experts)
    return [
        linear(f"{m}.gate.weight", f"{q}.W_router"),
        experts(tuple(f"{m}.experts.{e}.w1.weight" for e in E), f"{q}.W_gate"),
        experts(tuple(f"{m}.experts.{e}.w3.weight" for e in E), f"{q}.W_in"),
        experts(tuple(f"{m}.experts.{e}.w2.weight" for e in E), f"{q}.W_out"),
    ]


# ----------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Arch:
    """One supported Hugging Face architecture."""

    name: str
    config: Callable[[str, dict], Config]
    links: Callable[[Config, Callable[[str], bool]], list[Link]]
    layers: str  # attribute path of the layer list in transformers' model
    layer_prefix: str  # file-name prefix of layer i ("{i}" is replaced)
    auto: str  # the transformers Auto class that loads it
    ignore: str = r"$^"  # tensors without function (old buffers), dropped
    passthrough: str = r"$^"  # tensors outside the checked function, copied unchanged
    notes: tuple[str, ...] = field(default_factory=tuple)
    # its scores are soft-capped: transformers has no sdpa path, the reference registers an exact eager one
    soft_capped: bool = False
    # a mixture's experts stored one file tensor per expert, which transformers' loader fuses:
    # (the MoE block's prefix, the gate, up and down projections' names)
    expert_files: tuple[str, str, str, str] | None = None


_LLAMA_IGNORE = r".*rotary_emb\.inv_freq$"
ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch(
            "GPT2LMHeadModel",
            gpt2_config,
            gpt2_links,
            "transformer.h",
            "transformer.h.{i}.",
            "AutoModelForCausalLM",
            ignore=r".*\.attn\.(masked_)?bias$",
        ),
        Arch("GPT2Model", gpt2_config, gpt2_links, "h", "h.{i}.", "AutoModel", ignore=r".*\.attn\.(masked_)?bias$"),
        Arch(
            "BertModel",
            bert_config,
            bert_links,
            "encoder.layer",
            "encoder.layer.{i}.",
            "AutoModel",
            ignore=r"(bert\.)?embeddings\.position_ids$",
            passthrough=r"(bert\.)?pooler\..*",
            notes=("the pooler reads only the last hidden state; it is copied unchanged and not checked",),
        ),
        Arch(
            "LlamaForCausalLM",
            llama_like_config,
            llama_like_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
        ),
        Arch(
            "MistralForCausalLM",
            llama_like_config,
            llama_like_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
        ),
        Arch(
            "Qwen2ForCausalLM",
            llama_like_config,
            llama_like_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
        ),
        Arch(
            "MixtralForCausalLM",
            llama_like_config,
            llama_like_links,
            "model.layers",
            "model.layers.{i}.",
            "AutoModelForCausalLM",
            ignore=_LLAMA_IGNORE,
            expert_files=("block_sparse_moe.", "w1", "w3", "w2"),
        ),
    )
}


def arch_of(hf: dict, archs: dict[str, Arch] = ARCHS) -> Arch:
    names = hf.get("architectures")
    if not isinstance(names, list) or len(names) != 1 or not isinstance(names[0], str):
        raise GaugeAuditError(f"config.json must name exactly one architecture (architectures = {names!r})")
    if names[0] not in archs:
        raise GaugeAuditError(f"unknown architecture {names[0]} (supported: {', '.join(archs)})")
    return archs[names[0]]
