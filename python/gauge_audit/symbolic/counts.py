"""Dimension counts of transformer gauge groups: the papers' formulas and our corrected count.

Paper formulas take plain ints (or SymPy symbols, to get the formula itself) and
return ints (SymPy expressions for symbols):

=====================================  ===========================================================
:func:`mgs_layer_dim`                  MGS G_Layer (MHA): h·(d_k² + d_v²)
:func:`mgs_model_dim`                  MGS G_Model = ∏_l G_Layer: L·h·(d_k² + d_v²)
:func:`mgs_rope_layer_dim`             MGS G_RoPE: (GL(1,ℂ)^{d_k/2})^h × GL(d_v)^h: h·(d_k + d_v²)
:func:`mgs_gqa_layer_dim`              MGS G_share with g K/V groups: g·(d_k² + d_v²)  (RoPE: g·(d_k + d_v²))
:func:`wiki_gqa_layer_dim`             wiki §7: n_q·d_k² + n_kv·d_v²
:func:`nierop_redundancy`              van Nierop eq. (17): 2·n_t·n_h·d_h² + ½(d_e−1)(d_e−2)
:func:`wiki_group_dim`                 wiki §10.2: h(d_k² + d_v²) + log(h!)
:func:`wiki_param_dim`                 wiki §10.2: dim Θ = 4h(d_k + d_v)·d_model
:func:`attention_param_count`          the real number of W_Q,W_K,W_V,W_O entries
=====================================  ===========================================================

:func:`corrected_count` gives the continuous-symmetry dimension of a whole
architecture (:class:`ArchConfig`) as named components, each marked
``established`` (derived in :mod:`gauge_audit.symbolic`) or ``conjecture``
(to be confirmed by the Jacobian-nullity audit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy as sp

ESTABLISHED = "established"
EPS_ZERO = "exact only at ε = 0"
CONJECTURE = "conjecture"


def _half(x):
    """x/2 for ints (exact, x must be even) and SymPy expressions."""
    if isinstance(x, int):
        if x % 2:
            raise ValueError(f"{x} is odd")
        return x // 2
    return sp.Rational(1, 2) * x


# ------------------------------------------------------------------------------------------
# the papers' formulas


def mgs_layer_dim(h, d_k, d_v):
    """MGS G_max = ((GL(d_k))^h × (GL(d_v))^h) ⋊ S_h; S_h adds no dimension."""
    return h * (d_k**2 + d_v**2)


def mgs_model_dim(n_layers, h, d_k, d_v):
    """MGS G_Model = ∏_{l=1}^{L} G_Layer^(l)."""
    return n_layers * mgs_layer_dim(h, d_k, d_v)


def mgs_rope_layer_dim(h, d_k, d_v):
    """MGS G_RoPE with 𝒞_RoPE = GL(1,ℂ)^{d_k/2}: each GL(1,ℂ) has 2 real dims → d_k per head."""
    return h * (2 * _half(d_k) + d_v**2)


def mgs_gqa_layer_dim(n_groups, d_k, d_v, rope=False):
    """MGS G_share = ((GL(d_k))^g × (GL(d_v))^g) ⋊ …, g = number of K/V groups."""
    qk = 2 * _half(d_k) if rope else d_k**2
    return n_groups * (qk + d_v**2)


def wiki_gqa_layer_dim(n_q, n_kv, d_k, d_v):
    """wiki §7.2/7.4: G_GQA = (GL(d_k))^{n_query} × (GL(d_v))^{n_kv} → n_q·d_k² + n_kv·d_v²."""
    return n_q * d_k**2 + n_kv * d_v**2


def nierop_redundancy(n_t, n_h, d_h, d_e):
    """van Nierop eq. (17): 2·n_t·n_h·d_h² + ½(d_e−1)(d_e−2)."""
    return 2 * n_t * n_h * d_h**2 + _half((d_e - 1) * (d_e - 2))


def wiki_group_dim(h, d_k, d_v):
    """wiki §10.2: dim G_max = h(d_k² + d_v²) + log(h!)  (a SymPy expression; log(h!) is not an integer)."""
    return h * (d_k**2 + d_v**2) + sp.log(sp.factorial(h))


def wiki_param_dim(h, d_k, d_v, d_model):
    """wiki §10.2: dim Θ = 4h(d_k + d_v)·d_model."""
    return 4 * h * (d_k + d_v) * d_model


def attention_param_count(n_layers, d_model, n_heads, d_k, d_v=None, n_kv_heads=None):
    """Entries of W_Q, W_K, W_V, W_O over all layers (no biases)."""
    d_v = d_k if d_v is None else d_v
    n_kv = n_heads if n_kv_heads is None else n_kv_heads
    per_layer = d_model * (n_heads * d_k + n_kv * d_k + n_kv * d_v) + n_heads * d_v * d_model
    return n_layers * per_layer


def symbols(*names: str):
    """Positive integer SymPy symbols, for printing the formulas themselves."""
    return sp.symbols(" ".join(names), positive=True, integer=True)


# ------------------------------------------------------------------------------------------
# our corrected count


@dataclass(frozen=True)
class ArchConfig:
    """A decoder/encoder stack, enough to count its continuous gauge symmetries."""

    n_layers: int
    d_model: int
    n_heads: int
    d_k: int
    d_v: int | None = None  # default d_k
    n_kv_heads: int | None = None  # default n_heads (MHA); < n_heads: GQA, 1: MQA
    d_ff: int = 0
    norm: str = "layernorm"  # layernorm | rmsnorm | none
    norm_affine: bool = True
    norm_placement: str = "pre"  # pre | post
    final_norm: bool = True
    attn_bias: bool = False  # biases on Q, K, V and O
    mlp_bias: bool = False
    activation: str = "gelu"  # relu | gelu | silu | swiglu
    rope: bool = False
    tied_embeddings: bool = False
    vocab_size: int = 0
    n_positions: int = 0  # learned absolute positions (0: none)
    name: str = ""
    out_bias: bool | None = None  # bias on the attention output projection (default: attn_bias)
    unembed_bias: bool = False

    @property
    def pre_norm(self) -> bool:
        """x + f(n(x)): the norms read the stream before each sublayer."""
        return self.norm_placement == "pre"

    @property
    def post_norm(self) -> bool:
        """n(x + f(x)): the stream itself is normed after each add."""
        return self.norm_placement == "post"

    @classmethod
    def from_model(cls, cfg) -> ArchConfig:
        """The count's view of a reference-model :class:`~gauge_audit.models.Config` (no MoE)."""
        base = {"layernorm-noaffine": "layernorm", "rmsnorm-noweight": "rmsnorm"}.get(cfg.norm, cfg.norm)
        return cls(
            n_layers=cfg.n_layers,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            d_k=cfg.d_head,
            n_kv_heads=cfg.n_kv_heads,
            d_ff=cfg.d_ff if not cfg.attention_only else 0,
            norm=base,
            norm_affine=cfg.norm in ("layernorm", "rmsnorm"),
            norm_placement=cfg.norm_placement,
            final_norm=not cfg.outputs_stream,
            attn_bias=cfg.attn_bias,
            out_bias=cfg.out_bias,
            unembed_bias=cfg.unembed_bias,
            mlp_bias=cfg.mlp_bias,
            activation=cfg.act,
            rope=cfg.pos == "rope",
            tied_embeddings=cfg.tied,
            vocab_size=cfg.vocab,
            n_positions=cfg.n_ctx if cfg.pos == "learned" else 0,
            name=f"{cfg.family} (reference config)",
        )

    @property
    def has_out_bias(self) -> bool:
        return self.attn_bias if self.out_bias is None else self.out_bias

    @property
    def dv(self) -> int:
        return self.d_k if self.d_v is None else self.d_v

    @property
    def n_kv(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def with_(self, **kw) -> ArchConfig:
        return replace(self, **kw)


@dataclass(frozen=True)
class Component:
    name: str
    value: int
    status: str  # established | conjecture
    why: str


@dataclass(frozen=True)
class CountBreakdown:
    config: ArchConfig
    components: tuple[Component, ...] = field(default_factory=tuple)

    @property
    def established(self) -> int:
        return sum(c.value for c in self.components if c.status == ESTABLISHED)

    @property
    def conjectured(self) -> int:
        return sum(c.value for c in self.components if c.status == CONJECTURE)

    @property
    def total(self) -> int:
        return self.established + self.conjectured

    def as_dict(self) -> dict[str, int]:
        return {c.name: c.value for c in self.components}

    def table(self) -> str:
        rows = [f"  {c.name:<20} {c.value:>14,}  {c.status:<11}  {c.why}" for c in self.components]
        rows.append(f"  {'established total':<20} {self.established:>14,}")
        rows.append(f"  {'with conjectures':<20} {self.total:>14,}")
        return "\n".join(rows)


def corrected_count(cfg: ArchConfig) -> CountBreakdown:
    """Dimension of the continuous function-preserving parameter symmetries of ``cfg``.

    Established components are derived in :mod:`gauge_audit.symbolic` (attention GL
    actions and their RoPE/GQA restrictions by exact Lie-algebra rank; bias shifts by
    softmax shift invariance; ReLU/SwiGLU scaling by positive homogeneity; stream
    rotations and the corrected affine-norm reader rule in ``ln_affine_rotation``).
    Conjectures (LayerNorm's all-ones directions, stream scale, norm-free GL(d)) are
    what the Jacobian-nullity audit must confirm or refute.
    """
    L, d, dk, dv, nkv = cfg.n_layers, cfg.d_model, cfg.d_k, cfg.dv, cfg.n_kv
    comps: list[Component] = []

    def add(name, value, status, why):
        comps.append(Component(name, int(value), status, why))

    qk = dk if cfg.rope else dk * dk
    add(
        "attn_qk",
        L * nkv * qk,
        ESTABLISHED,
        "per K group: commutant of RoPE (a·I + b·J per plane, d_k dims)"
        if cfg.rope
        else "per K group: W_Q→W_Q·M, W_K→W_K·M^-T, M ∈ GL(d_k)",
    )
    add("attn_vo", L * nkv * dv * dv, ESTABLISHED, "per V group: W_V→W_V·N, W_O→N^-1·W_O")
    if cfg.attn_bias:
        add(
            "key_bias_shift",
            0 if cfg.rope else L * nkv * dk,
            ESTABLISHED,
            "b_K→b_K+c changes each query's scores by the constant q·c (softmax shift); broken by RoPE"
            if not cfg.rope
            else "RoPE rotates the key bias: shift not constant across keys",
        )
        add(
            "value_bias_fold",
            L * nkv * dv if cfg.has_out_bias else 0,
            ESTABLISHED,
            "b_V→b_V+v, b_O→b_O−v·W_O (attention rows sum to 1); needs b_O",
        )
    if cfg.activation in ("relu", "swiglu"):
        add(
            "ffn_scaling",
            L * cfg.d_ff,
            ESTABLISHED,
            "positive per-neuron scaling (ReLU homogeneous; SwiGLU: scale the linear 'up' branch)",
        )
    else:
        add("ffn_scaling", 0, ESTABLISHED, f"{cfg.activation} is not positively homogeneous: no continuous scaling")

    n_norms_inner = 2 * L
    tied_final = cfg.tied_embeddings and cfg.final_norm and cfg.norm_affine
    if cfg.norm in ("layernorm", "rmsnorm"):
        rot = (d - 1) * (d - 2) // 2 if cfg.norm == "layernorm" else d * (d - 1) // 2
        grp = "SO(d-1) fixing the all-ones vector" if cfg.norm == "layernorm" else "SO(d)"
        if cfg.post_norm and cfg.norm_affine:
            add(
                "stream_rotation",
                0,
                ESTABLISHED,
                "post-norm with affine γ: the stream is γ⊙z+β, no diagonal γ' gives γ'⊙(gz) = g(γ⊙z)",
            )
        elif tied_final:
            add(
                "stream_rotation",
                0,
                ESTABLISHED,
                "tied embedding/unembedding with affine final norm: g must commute with diag(γ_f) → only finitely many g",
            )
        else:
            add(
                "stream_rotation",
                rot,
                ESTABLISHED,
                f"{grp}; readers of affine norms use W·diag(γ)·gᵀ·diag(γ)^-1 (corrected rule)",
            )
        if cfg.norm_affine and cfg.pre_norm:
            n_scale = n_norms_inner + (1 if cfg.final_norm and not cfg.tied_embeddings else 0)
            add("norm_scale", n_scale * d, ESTABLISHED, "γ→c⊙γ (and β→c⊙β), readers W→W·diag(c)^-1")
            if cfg.norm == "layernorm":
                add(
                    "norm_shift",
                    n_scale * d,
                    ESTABLISHED,
                    "β→β+δ: a reader with a bias takes b→b−δ·W; without one it absorbs δ through its weights, "
                    "because the LN output lies in the hyperplane y·γ⁻¹ = β·γ⁻¹ (confirmed by the nullity audit)",
                )
        elif cfg.norm_affine and cfg.post_norm:
            add("norm_scale", 0, CONJECTURE, "post-norm: γ feeds the residual stream directly, no compensating reader")
        if cfg.norm == "layernorm" and cfg.pre_norm:
            # LayerNorm removes the all-ones component of its input and its readers see only D·1^⊥ + β.
            # A reader column W→W+γ⁻¹·u sees the constant (β·γ⁻¹)·u: absorbed by its bias, free when β = 0,
            # free for a key column (softmax ignores a per-query constant; not under RoPE), and for a value
            # column when b_O exists (attention rows sum to 1).
            free = not cfg.norm_affine
            q_cols = cfg.n_heads * dk if (cfg.attn_bias or free) else 0
            k_cols = nkv * dk if (cfg.attn_bias or free or not cfg.rope) else 0
            v_cols = nkv * dv if (cfg.attn_bias or free or cfg.has_out_bias) else 0
            mlp_cols = cfg.d_ff * (2 if cfg.activation == "swiglu" else 1) if (cfg.mlp_bias or free) else 0
            reader = L * (q_cols + k_cols + v_cols + mlp_cols)
            if cfg.final_norm and not cfg.tied_embeddings and (free or cfg.unembed_bias):
                reader += cfg.vocab_size
            add(
                "ln_reader_ones",
                reader,
                ESTABLISHED,
                "readers W→W+γ⁻¹·u (zero on the LN output's hyperplane); the constant (β·γ⁻¹)·u goes to a bias, "
                "vanishes with β = 0, or is ignored (keys) / carried by b_O (values) (confirmed by the nullity audit)",
            )
            writer = L * (cfg.n_heads * dv + cfg.d_ff + int(cfg.has_out_bias) + int(cfg.mlp_bias))
            writer += cfg.n_positions + (0 if cfg.tied_embeddings else cfg.vocab_size)
            add(
                "ln_writer_ones",
                writer if cfg.final_norm else 0,
                ESTABLISHED,
                "writers W_out→W_out+1·uᵀ: every reader is a LayerNorm, which ignores the all-ones component "
                "(confirmed by the nullity audit)",
            )
        if cfg.pre_norm and cfg.n_positions and not cfg.tied_embeddings:
            add(
                "embed_offset",
                d - 1 if cfg.norm == "layernorm" else d,
                ESTABLISHED,
                "c added to every row of W_E and subtracted from every row of W_pos (the all-ones part is a "
                "writer direction already under LayerNorm); broken by tied embeddings (W_E is also read)",
            )
        if cfg.pre_norm and cfg.final_norm:
            add(
                "stream_scale",
                1,
                EPS_ZERO,
                "x→c·x for c>0: exact only when the norm's ε is 0 (measured: not flat at ε = 1e-5, flat at ε = 0)",
            )
    else:
        add(
            "stream_gl",
            d * (d - 1) // 2 if cfg.tied_embeddings else d * d,
            CONJECTURE,
            "no normalization: any invertible stream map (orthogonal when embeddings are tied)",
        )
    return CountBreakdown(cfg, tuple(comps))


# ------------------------------------------------------------------------------------------
# the reference architectures used by the paper claims (parameter totals from the model cards)

GPT2_SMALL = ArchConfig(
    name="GPT-2 (124M)",
    n_layers=12,
    d_model=768,
    n_heads=12,
    d_k=64,
    d_ff=3072,
    attn_bias=True,
    mlp_bias=True,
    activation="gelu",
    tied_embeddings=True,
    vocab_size=50257,
    n_positions=1024,
)
GPT2_XL = ArchConfig(
    name="GPT-2-XL (1.5B)",
    n_layers=48,
    d_model=1600,
    n_heads=25,
    d_k=64,
    d_ff=6400,
    attn_bias=True,
    mlp_bias=True,
    activation="gelu",
    tied_embeddings=True,
    vocab_size=50257,
    n_positions=1024,
)


def _llama(size: str, n_layers: int, d_model: int, n_heads: int, d_ff: int) -> ArchConfig:
    """A LLaMA-1 size: heads of 128, RMSNorm, SwiGLU, RoPE, a 32 000-token vocabulary."""
    return ArchConfig(
        name=f"LLaMA-{size}",
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_k=128,
        d_ff=d_ff,
        norm="rmsnorm",
        activation="swiglu",
        rope=True,
        vocab_size=32000,
    )


LLAMA = {
    "7B": _llama("7B", 32, 4096, 32, 11008),
    "13B": _llama("13B", 40, 5120, 40, 13824),
    "33B": _llama("33B", 60, 6656, 52, 17920),
    "65B": _llama("65B", 80, 8192, 64, 22016),
}


BERT_BASE = ArchConfig(
    name="Transformer-Base / BERT-base (110M)",
    n_layers=12,
    d_model=768,
    n_heads=12,
    d_k=64,
    d_ff=3072,
    norm_placement="post",
    attn_bias=True,
    mlp_bias=True,
    activation="gelu",
    tied_embeddings=True,
    vocab_size=30522,
    n_positions=512,
)

ARCHITECTURES = {
    "gpt2": GPT2_SMALL,
    "gpt2-xl": GPT2_XL,
    "bert-base": BERT_BASE,
    **{f"llama-{k.lower()}": v for k, v in LLAMA.items()},
}
