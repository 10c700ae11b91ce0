"""One config dataclass for every reference family; the family files set the defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from ..errors import GaugeAuditError
from .rope import scaling_problem

NORMS = ("layernorm", "layernorm-noaffine", "rmsnorm", "rmsnorm-noweight", "none")
QK_NORMS = ("none", "head", "full")
ACTS = ("relu", "gelu", "gelu-tanh", "silu", "swiglu")  # gelu: exact erf form; gelu-tanh: GPT-2's tanh approximation


@dataclass(frozen=True)
class Config:
    family: str  # a name of families.FAMILIES: gpt2 | bert | llama | qwen | moe | attn | gemma | deepseek | …
    d_model: int = 16
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 4  # = n_heads: MHA; 1 < n_kv < n_heads: GQA; 1: MQA
    d_head: int = 4
    d_ff: int = 32
    n_ctx: int = 16  # maximum sequence length (learned positions) / default input length
    vocab: int = 64
    norm: str = "layernorm"
    norm_placement: str = "pre"  # pre: x + f(norm(x)) (GPT-2, LLaMA); post: norm(x + f(x)) (BERT);
    #                              output: x + norm(f(x)) with no pre-norm (OLMo 2)
    #                              sandwich: x + norm'(f(norm(x))) (Gemma 2/3, models/gemma.py)
    norm_eps: float = 1e-5
    act: str = "gelu"
    attn_bias: bool = True  # b_Q, b_K, b_V (and b_O when mlp_bias: GPT-2/BERT style)
    out_bias: bool = True  # b_O
    mlp_bias: bool = True
    pos: str = "learned"  # learned | rope | none
    rope_style: str = (
        "half"  # half: planes (i, i + d/2) (GPT-NeoX/LLaMA-HF); interleaved: (2i, 2i+1) (original RoFormer/Meta)
    )
    rope_base: float = 10000.0
    rope_type: str = (
        "default"  # frequency table (models/rope.py): default | linear | dynamic | yarn | llama3 | longrope
    )
    rope_params: tuple = ()  # that table's options as sorted (name, value) pairs (floats; tuples for longrope)
    rotary_dim: int = 0  # coordinates of each head RoPE rotates (the first ones); 0: the whole head
    window: int = 0  # > 0: sliding-window attention, position p sees p − window < s ≤ p (Mistral)
    parallel_residual: bool = False  # pre-norm x + Attn(n₁(x)) + FFN(n₂(x)) (GPT-NeoX/Pythia), not in sequence
    qk_norm: str = "none"  # none | head: one RMSNorm over d_head on every query/key head, weights shared
    #                             by the heads (Qwen3)
    #                             | full: one RMSNorm over all query (all key) heads jointly (OLMo 2); both before RoPE
    causal: bool = True
    tied: bool = False  # W_U = W_Eᵀ
    unembed: bool = True  # the output is logits; False: the last hidden state (BERT, a bare GPT2Model)
    unembed_bias: bool = False
    n_types: int = 0  # BERT token-type embeddings
    embed_norm: bool = False  # BERT LayerNorm after the embedding sum
    experts: int = 0  # > 0: the FFN is a top-k softmax-gated mixture of experts
    top_k: int = 0
    router_renorm: bool = True  # the k kept gates renormalised to sum 1 (Mixtral; Qwen3-MoE's norm_topk_prob)

    # ---- the parts the rooms ask about, answered here from the family's switches (no room names a family)
    latent_attention: ClassVar[bool] = False  # multi-head latent attention (MLA): a DeepseekConfig

    @property
    def attention_only(self) -> bool:
        """A stack of attention layers on given vectors: no token tables, norms, FFN or unembedding."""
        return self.family == "attn"

    @property
    def outputs_stream(self) -> bool:
        """The output is the last residual stream itself, with no final norm or unembedding (an
        attention stack, an encoder)."""
        return self.family in ("attn", "bert")

    # where the norms sit around each sublayer f: ``norm_placement`` names the four layouts, and the
    # rooms ask these instead (pre = normed inputs; output = normed outputs; sandwich = both; post = sums)
    @property
    def normed_inputs(self) -> bool:
        """Each sublayer reads n(x), so every reader of the stream inside the blocks is a norm."""
        return self.norm_placement in ("pre", "sandwich")

    @property
    def normed_outputs(self) -> bool:
        """Each sublayer's output passes a norm before it is added: γ'⊙n(f(·)) enters the stream."""
        return self.norm_placement in ("output", "sandwich")

    @property
    def normed_sums(self) -> bool:
        """n(x + f(x)): the stream itself is normed after each add, so the stream is a norm's output."""
        return self.norm_placement == "post"

    @property
    def pre_norm(self) -> bool:
        """x + f(n(x)): normed inputs, raw outputs — the stream is written only by linear maps."""
        return self.normed_inputs and not self.normed_outputs

    @property
    def whole_head_rotary(self) -> bool:
        """RoPE always rotates every coordinate of a head: the family has no partial rotary."""
        return False

    @property
    def expert_groups(self) -> int:
        """Groups the router ranks before it picks experts (DeepSeek's n_group); 1: none."""
        return 1

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def with_(self, **changes) -> Config:
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise GaugeAuditError(f"unknown config option(s): {', '.join(unknown)}")
        return validate(replace(self, **changes))


def same_architecture(a: Config, b: Config) -> None:
    """Refuse two descriptions that differ: the family first, then the first field that differs."""
    if a.family != b.family:
        raise GaugeAuditError(f"different architectures: {a.family} vs {b.family}")
    for f in fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            raise GaugeAuditError(f"different architectures: {f.name} = {va} vs {vb}")


def generic_sizes(cfg: Config, planes: int = 2) -> dict:
    """The sizes at which no structure of ``cfg`` is special, as overrides: ``planes`` rotary planes
    per head (at one plane SO(2) commutes with every rotary rotation), a partial rotary keeping a
    pass-through block of two, the rotary frequencies at the default table; grouped-query attention
    with two KV groups of two query heads.  Empty for a configuration with neither."""
    over: dict = {}
    if cfg.pos == "rope":
        partial = 0 < cfg.rotary_dim < cfg.d_head
        over.update(
            rotary_dim=2 * planes if partial else 0,
            d_head=2 * planes + (2 if partial else 0),
            rope_type="default",
            rope_params=(),
        )
    if cfg.n_kv_heads < cfg.n_heads:
        over.update(n_heads=4, n_kv_heads=2)
    return over


def validate(cfg: Config) -> Config:
    def need(cond: bool, msg: str):
        if not cond:
            raise GaugeAuditError(f"invalid {cfg.family} config: {msg}")

    for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "n_ctx"):
        need(isinstance(getattr(cfg, name), int) and getattr(cfg, name) >= 1, f"{name} must be a positive integer")
    need(cfg.family == "attn" or cfg.vocab >= 2, "vocab must be >= 2")
    need(cfg.family == "attn" or cfg.d_ff >= 1, "d_ff must be >= 1")
    need(
        cfg.n_heads % cfg.n_kv_heads == 0, f"n_heads ({cfg.n_heads}) must be divisible by n_kv_heads ({cfg.n_kv_heads})"
    )
    need(cfg.norm in NORMS, f"norm must be one of {', '.join(NORMS)}")
    need(cfg.act in ACTS, f"act must be one of {', '.join(ACTS)}")
    need(
        cfg.norm_placement in ("pre", "post", "output", "sandwich"),
        "norm_placement must be pre, post, output or sandwich",
    )
    need(cfg.norm_placement != "sandwich" or cfg.family == "gemma", "sandwich norms are the gemma family's")
    need(cfg.pos in ("learned", "rope", "none"), "pos must be learned, rope or none")
    need(cfg.rope_style in ("half", "interleaved"), "rope_style must be half or interleaved")
    need(cfg.pos != "rope" or cfg.d_head % 2 == 0, "RoPE needs an even d_head")
    need(
        isinstance(cfg.rotary_dim, int) and 0 <= cfg.rotary_dim <= cfg.d_head and cfg.rotary_dim % 2 == 0,
        "rotary_dim must be an even number in 0..d_head (0: the whole head)",
    )
    need(
        cfg.pos == "rope" or (cfg.rope_type == "default" and not cfg.rope_params and cfg.rotary_dim == 0),
        "RoPE options given without pos=rope",
    )
    problem = scaling_problem(cfg.rope_type, cfg.rope_params, cfg.rotary_dim or cfg.d_head)
    need(problem is None, f"RoPE scaling: {problem}")
    need(isinstance(cfg.window, int) and cfg.window >= 0, "window must be a non-negative integer (0: none)")
    need(cfg.window == 0 or cfg.causal, "a sliding window needs causal attention")
    need(
        not cfg.parallel_residual or (cfg.norm_placement == "pre" and cfg.family != "attn"),
        "a parallel residual needs pre-norm blocks with an FFN",
    )
    need(cfg.qk_norm in QK_NORMS, f"qk_norm must be one of {', '.join(QK_NORMS)}")
    need(cfg.qk_norm == "none" or cfg.norm.startswith("rmsnorm"), "a QK-norm needs an RMSNorm model")
    need(not cfg.tied or cfg.family not in ("attn", "bert"), "--tied needs token embeddings and an unembedding")
    need(cfg.unembed or not (cfg.tied or cfg.unembed_bias), "tied embeddings / an unembedding bias need an unembedding")
    need(cfg.experts == 0 or 1 <= cfg.top_k <= cfg.experts, "top_k must be in 1..experts")
    need(cfg.experts > 0 or cfg.top_k == 0, "top_k given without experts")
    need(cfg.norm_eps >= 0, "norm_eps must be >= 0")
    return cfg
