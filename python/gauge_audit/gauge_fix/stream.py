"""Gauge fixing of the norms, biases and residual stream (steps 1–8 of the pipeline).

Each ``fix_*`` imposes one gauge condition with one action; each ``cond_*`` returns the
condition's residuals (zero at a canonical point), as a differentiable function of the parameters,
one entry per condition — the test compares their number with the nullity theory's family
dimension and checks that they cut every orbit transversally.

Order matters: each step's condition is invariant under the groups of the steps after it (so a
later step never undoes an earlier one), e.g. γ = 1 survives the stream rotation (γ unchanged),
writer rows ⊥ 1 survive every left or right multiplication that fixes 1, γᵀ·W = 0 for a reader
column survives any mixing of columns.
"""

from __future__ import annotations

import torch

from ..actions import ACTIONS, Element
from ..actions.attention import rotated_coordinates
from ..actions.offsets import LN, absorbed_shift_norms, ln_writers, offset_tables, reader_ones_columns, segments
from ..actions.strata import spread
from ..actions.stream import norm_readers
from ..models.config import Config
from ..runtime import forget_products
from .base import Context, Decision, Params, gram_axes, ones_basis


def _applies(action: str, cfg: Config) -> bool:
    return ACTIONS[action].applies(cfg) is None


def _gamma(p: Params, norm: str, d: int) -> torch.Tensor:
    return p[f"{norm}.w"] if f"{norm}.w" in p else torch.ones(d, dtype=torch.float64)


def _reader_names(readers) -> set:
    return {w for rs in readers for w, _ in rs} | {b for rs in readers for _, b in rs if b is not None}


# ----------------------------------------------------------------------------- 1 norm-scale
def _scaled_norms(cfg: Config, p: Params) -> list[str]:
    if not _applies("norm-scale", cfg):
        return []
    return [n for n in norm_readers(cfg, p) if f"{n}.w" in p]


def norm_scale_family(cfg: Config) -> str:
    """The nullity family norm-scale fixes: every weighted pre-norm's scale, or (normed sublayer
    outputs, OLMo 2) the final norm's alone."""
    return "final-norm-scale" if cfg.normed_outputs and not cfg.normed_inputs else "norm-scale"


def fix_norm_scale(ctx: Context) -> None:
    """Condition: γ = 1 for every weighted pre-norm (not a tied final norm; with normed sublayer
    outputs only the final norm, whose reader is an untied unembedding).

    Reachable: s = 1/γ (norm-scale: γ ↦ γ⊙s, β ↦ β⊙s, readers diag(s)⁻¹·W).  Unique: the scale
    group acts freely on γ with no zero entry.  A zero entry of γ cannot be scaled to 1: it is left
    and reported (its direction is then not fixed).  Sandwich norms (Gemma): the post-norms are not
    scaled (they write into the stream); where every post-norm weight (and a tied final one) is
    constant the stream rotation becomes a symmetry that no step fixes — reported as a tie."""
    p = ctx.params
    parts, notes = {}, []
    for n in _scaled_norms(ctx.cfg, p):
        g = p[f"{n}.w"]
        zero = g == 0
        if zero.any():
            notes.append(f"{n}: {int(zero.sum())} zero weight entries keep their scale (not unique)")
        parts[n] = torch.where(zero, torch.ones_like(g), 1.0 / torch.where(zero, torch.ones_like(g), g))
    decisions = _sandwich_special(ctx)
    if parts:
        kappa = max(float(s.abs().max() / s.abs().min()) for s in parts.values())
        family = norm_scale_family(ctx.cfg)
        ctx.apply(family, "norm-scale", Element(parts, kappa), "γ = 1 for every weighted pre-norm", decisions, notes)


def _sandwich_special(ctx: Context) -> list[Decision]:
    """Gemma's special point: every post-norm weight γ' (and a tied final weight) ∝ 1 — then
    n(o)⊙γ' commutes with every rotation and the stream rotation so(d) is a symmetry.  The margin:
    the largest relative spread (max − min)/max|γ'| among them (0 at the special point); a relative
    change u of every entry moves a spread by at most 2u."""
    cfg, p = ctx.cfg, ctx.params
    if not (cfg.normed_inputs and cfg.normed_outputs):
        return []
    names = [f"blocks.{i}.{n}.w" for i in range(cfg.n_layers) for n in ("ln1_post", "ln2_post")]
    names += ["ln_final.w"] if cfg.tied else []
    where = "post-norm weights (all constant: the stream rotation is a symmetry, not fixed)"
    return [ctx.decision("spectrum", where, [spread(p[n]) for n in names], 2.0, joint=True)]


def _cond_scale(cfg: Config, p: Params) -> torch.Tensor | None:
    norms = _scaled_norms(cfg, p)
    return torch.cat([p[f"{n}.w"] - 1.0 for n in norms]) if norms else None


def cond_norm_scale(cfg: Config, p: Params) -> torch.Tensor | None:
    return _cond_scale(cfg, p) if norm_scale_family(cfg) == "norm-scale" else None


def cond_final_norm_scale(cfg: Config, p: Params) -> torch.Tensor | None:
    return _cond_scale(cfg, p) if norm_scale_family(cfg) == "final-norm-scale" else None


# ----------------------------------------------------------------------------- 2 norm-shift
def _shift_norms(cfg: Config, p: Params) -> tuple[list[str], list[str]]:
    """(affine pre-LNs whose readers all have biases, affine pre-LNs with an unbiased reader)."""
    if cfg.attention_only or cfg.norm != "layernorm" or not cfg.pre_norm:
        return [], []
    absorbed = absorbed_shift_norms(cfg, p)
    biased = [n for n in norm_readers(cfg, p) if f"{n}.b" in p and n not in absorbed]
    return biased, absorbed


def fix_norm_shift(ctx: Context) -> None:
    """Condition: β = 0 for an affine pre-LayerNorm whose readers all have biases (they take −β·W);
    β = γ where some reader has none (it absorbs the shift through the LayerNorm's constant
    response γ⁻¹·y = β·γ⁻¹, which must stay non-zero: β = γ makes it d).

    Reachable: δ = −β, resp. γ − β (norm-shift, norm-shift-absorbed).  Unique: the shift group acts
    on β by translation."""
    p = ctx.params
    biased, absorbed = _shift_norms(ctx.cfg, p)
    readers = norm_readers(ctx.cfg, p)
    if biased:
        ctx.apply(
            "norm-shift",
            "norm-shift",
            Element({n: -p[f"{n}.b"] for n in biased}, 1.0),
            "β = 0 for every affine pre-LayerNorm whose readers all have biases",
            reads=_reader_names([readers[n] for n in biased]),
        )
    if absorbed:
        p = ctx.params
        ctx.apply(
            "norm-shift",
            "norm-shift-absorbed",
            Element({n: p[f"{n}.w"] - p[f"{n}.b"] for n in absorbed}, 1.0),
            "β = γ for every affine pre-LayerNorm with a reader without a bias",
            reads={f"{n}.w" for n in absorbed} | _reader_names([readers[n] for n in absorbed]),
        )


def cond_norm_shift(cfg: Config, p: Params) -> torch.Tensor | None:
    biased, absorbed = _shift_norms(cfg, p)
    parts = [p[f"{n}.b"] for n in biased] + [p[f"{n}.b"] - p[f"{n}.w"] for n in absorbed]
    return torch.cat(parts) if parts else None


# ----------------------------------------------------------------------------- 3 reader-ones
def _reader_sums(cfg: Config, p: Params) -> dict[str, torch.Tensor]:
    """γᵀ·W per absorbing column of every LayerNorm reader (1ᵀ·W without affine part)."""
    return {
        w: torch.einsum("d,...df->...f", _gamma(p, norm, cfg.d_model), p[w])
        for w, (norm, _, _) in reader_ones_columns(cfg, p).items()
    }


def fix_reader_ones(ctx: Context) -> None:
    """Condition: γᵀ·W[:, j] = 0 for every column j of a LayerNorm reader that can absorb a
    constant (1ᵀ·W[:, j] = 0 without affine part).

    Reachable: t_j = −γᵀ·W[:, j] / d (reader-ones adds t_j·γ⁻¹ and γᵀγ⁻¹ = d).  Unique: one
    translation per column, transversal since γᵀγ⁻¹ ≠ 0.  Invariant under the later groups: column
    mixing (head GL, FFN scalings) keeps γᵀ·W = 0, as do norm-scale (γ⊙s, W/s) and rotations
    fixing 1 (γ = 1 then)."""
    cfg = ctx.cfg
    cols = reader_ones_columns(cfg, ctx.params)
    if not cols:
        return
    parts = {w: -s / cfg.d_model for w, s in _reader_sums(cfg, ctx.params).items()}
    reads = set()
    for w, (norm, _b, mode) in cols.items():
        reads |= {f"{norm}.w", f"{norm}.b"}
        if mode == "fold":
            reads.add(w.rsplit(".", 1)[0] + ".W_O")
    ctx.apply(
        "ln-reader-ones",
        "reader-ones",
        Element(parts, 1.0),
        "γᵀ·W[:, j] = 0 for every LayerNorm reader column that can absorb a constant",
        reads=reads,
    )


def cond_reader_ones(cfg: Config, p: Params) -> torch.Tensor | None:
    sums = _reader_sums(cfg, p)
    return torch.cat([s.reshape(-1) for s in sums.values()]) if sums else None


# ----------------------------------------------------------------------------- 4 router-offset
def _router_basis(cfg: Config, p: Params, i: int) -> torch.Tensor | None:
    """Directions of the router offset not already fixed by reader-ones: all of ℝ^d, or γ^⊥ when
    the router's columns have the reader-ones direction (then γᵀ·W·1 = 0 already)."""
    w = f"blocks.{i}.moe.W_router"
    cols = reader_ones_columns(cfg, p)
    if w not in cols:
        return None
    g = _gamma(p, cols[w][0], cfg.d_model)
    if f"{cols[w][0]}.w" not in p:
        return ones_basis(cfg.d_model)
    q, _ = torch.linalg.qr(torch.cat([g[:, None], torch.eye(cfg.d_model, dtype=torch.float64)], 1))
    return q[:, 1 : cfg.d_model]


def fix_router_offset(ctx: Context) -> None:
    """Condition: W_router·1 = 0 (the router columns sum to zero) in every MoE block.

    Reachable: c = −W_router·1 / E (router-offset adds c to every column).  Unique: translation.
    Invariant under the stream rotation (C⁻¹·W·1 = 0) and expert permutations."""
    cfg, p = ctx.cfg, ctx.params
    if not _applies("router-offset", cfg):
        return
    c = torch.zeros(cfg.n_layers, cfg.d_model, dtype=torch.float64)
    for i in _routed(cfg, p):
        c[i] = -p[f"blocks.{i}.moe.W_router"].sum(1) / cfg.experts
    ctx.apply("router-offset", "router-offset", Element({"c": c}, 1.0), "W_router·1 = 0 in every MoE block")


def _routed(cfg: Config, p: Params) -> list[int]:
    """The blocks with a router (DeepSeek's first blocks have a dense FFN instead)."""
    return [i for i in range(cfg.n_layers) if f"blocks.{i}.moe.W_router" in p]


def cond_router_offset(cfg: Config, p: Params) -> torch.Tensor | None:
    if not _applies("router-offset", cfg):
        return None
    out = []
    for i in _routed(cfg, p):
        s = p[f"blocks.{i}.moe.W_router"].sum(1)
        basis = _router_basis(cfg, p, i)
        out.append(s if basis is None else basis.T @ s)
    return torch.cat(out) if out else None


# ----------------------------------------------------------------------------- 5 embed-offset
def _offset_projected(cfg: Config) -> bool:
    """Is the embedding sum read through a LayerNorm (so its 1-component is writer-ones')?"""
    if cfg.norm not in LN:
        return False
    return cfg.pre_norm or cfg.embed_norm


def _mean_rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).mean(0)


def fix_embed_offset(ctx: Context) -> None:
    """Condition: the rows of W_pos (and of BERT's W_tt) have mean zero (their projection on 1^⊥
    when a LayerNorm reads the sum: the 1-component is writer-ones').

    Reachable: c_tt = −mean(W_tt), c_E = mean(W_pos) − c_tt (embed-offset moves a table by +c and
    W_pos by −c).  Unique: translation.  Invariant under the later groups (rotations are linear)."""
    cfg, p = ctx.cfg, ctx.params
    tables = offset_tables(cfg, p)
    if not tables:
        return
    d = cfg.d_model
    proj = torch.eye(d, dtype=torch.float64) - (1.0 / d if _offset_projected(cfg) else 0.0)
    parts = {}
    c_tt = torch.zeros(d, dtype=torch.float64)
    if "embed.W_tt" in tables:
        c_tt = -proj @ _mean_rows(p["embed.W_tt"])
        parts["embed.W_tt"] = c_tt
    parts["embed.W_E"] = proj @ _mean_rows(p["embed.W_pos"]) - c_tt
    ctx.apply(
        "embed-offset",
        "embed-offset",
        Element(parts, 1.0),
        "mean of the rows of W_pos (and W_tt) = 0" + (" on 1^⊥" if _offset_projected(cfg) else ""),
    )


def cond_embed_offset(cfg: Config, p: Params) -> torch.Tensor | None:
    tables = offset_tables(cfg, p)
    if not tables:
        return None
    basis = ones_basis(cfg.d_model) if _offset_projected(cfg) else torch.eye(cfg.d_model, dtype=torch.float64)
    rows = [_mean_rows(p["embed.W_pos"])] + ([_mean_rows(p["embed.W_tt"])] if "embed.W_tt" in tables else [])
    return torch.cat([basis.T @ r for r in rows])


# ----------------------------------------------------------------------------- 6 the bias chain
def _opening_value(p: Params, name: str) -> torch.Tensor:
    """The constant a stretch's opening adds: the bias / β itself, or the mean row of a table."""
    return _mean_rows(p[name]) if name.startswith("embed.W_") else p[name]


def _trade_projector(cfg: Config) -> torch.Tensor:
    """The part of b_out the parallel-bias-trade moves: 1^⊥ under a LayerNorm stream (along 1 the
    bias is writer-ones'), all of ℝ^d otherwise."""
    eye = torch.eye(cfg.d_model, dtype=torch.float64)
    return eye - 1.0 / cfg.d_model if cfg.norm in LN else eye


def fix_bias_chain(ctx: Context) -> None:
    """Conditions, in stream order (block by block, because a stretch's closing bias may open the
    next one and value-bias-fold writes b_O):

    * stream-translation: the bias or β that opens each stretch of stream with biased readers is 0
      (an opening embedding table: its mean row is 0) — reachable by c = −opening (segment-shift),
      unique (translation);
    * key-bias-shift: b_K = 0 on the coordinates RoPE leaves alone (all without RoPE, the last
      d_k − R under a partial rotary; none under full RoPE: the action does not apply) — reachable
      by c = −b_K there and 0 on the rotated ones, unique;
    * value-bias-fold: b_V = 0 (with b_O) — reachable by c = −b_V (b_O takes Σ_h b_V·W_O[h]), unique;
    * parallel-bias-trade (a parallel residual): P·b_out = 0, P the projector on 1^⊥ under a
      LayerNorm stream (identity otherwise) — reachable by c = −P·b_out (b_O takes P·b_out), unique
      (translation on the image of P).  After value-bias-fold in each block, since both write b_O
      and only this condition (on b_out) must survive the other: value-bias-fold and writer-ones
      never touch P·b_out (writer-ones adds multiples of 1, which P removes).

    Each is invariant under the head GL groups (b_K·M⁻ᵀ, b_V·N stay 0), permutations, writer-ones
    and the stream rotation (it fixes 1, so P·b_out·R = P·(b_out·R))."""
    cfg = ctx.cfg
    segs = {s.label: s for s in segments(cfg, ctx.params)}
    key, value = _applies("key-bias-shift", cfg), _applies("value-bias-fold", cfg)
    trade = _applies("parallel-bias-trade", cfg)
    shape = (cfg.n_layers, cfg.n_kv_heads, cfg.d_head)
    rotated = rotated_coordinates(cfg)

    def segment(label):
        if label in segs:
            s = segs[label]
            c = -_opening_value(ctx.params, s.opening)
            ctx.apply(
                "stream-translation",
                "segment-shift",
                Element({label: c}, 1.0),
                f"the opening {s.opening} of stretch {label} adds 0",
                reads={w for w, _ in s.readers},
            )

    def bias(i, name, family, action, first=0, reads=()):
        c = torch.zeros(shape, dtype=torch.float64)
        c[i, :, first:] = -ctx.params[f"blocks.{i}.attn.b_{name}"][:, first:]
        where = f" on coordinates {first}..{cfg.d_head - 1}" if first else ""
        ctx.apply(family, action, Element({"c": c}, 1.0), f"b_{name} = 0{where} in block {i}", reads=reads)

    def parallel(i):
        c = torch.zeros(cfg.n_layers, cfg.d_model, dtype=torch.float64)
        c[i] = -_trade_projector(cfg) @ ctx.params[f"blocks.{i}.mlp.b_out"].double()
        on = " on 1^⊥" if cfg.norm in LN else ""
        ctx.apply("parallel-bias-trade", "parallel-bias-trade", Element({"c": c}, 1.0), f"b_out = 0{on} in block {i}")

    for i in range(cfg.n_layers):
        segment(f"attn{i}")
        if key:
            bias(i, "K", "key-bias-shift", "key-bias-shift", first=rotated)
        if value:
            bias(i, "V", "value-bias-fold", "value-bias-fold", reads={f"blocks.{i}.attn.W_O"})
        if trade:
            parallel(i)
        segment(f"ffn{i}")
    segment("unembed")


def cond_segments(cfg: Config, p: Params) -> torch.Tensor | None:
    segs = segments(cfg, p)
    return torch.cat([_opening_value(p, s.opening) for s in segs]) if segs else None


def cond_key_bias(cfg: Config, p: Params) -> torch.Tensor | None:
    if not _applies("key-bias-shift", cfg):
        return None
    first = rotated_coordinates(cfg)
    return torch.cat([p[f"blocks.{i}.attn.b_K"][:, first:].reshape(-1) for i in range(cfg.n_layers)])


def cond_value_bias(cfg: Config, p: Params) -> torch.Tensor | None:
    if not _applies("value-bias-fold", cfg):
        return None
    return torch.cat([p[f"blocks.{i}.attn.b_V"].reshape(-1) for i in range(cfg.n_layers)])


def cond_parallel_bias(cfg: Config, p: Params) -> torch.Tensor | None:
    """P·b_out per parallel block, in coordinates of P's image (the Helmert basis of 1^⊥ under a
    LayerNorm stream: d − 1 numbers; all d entries otherwise)."""
    if not _applies("parallel-bias-trade", cfg):
        return None
    basis = ones_basis(cfg.d_model) if cfg.norm in LN else torch.eye(cfg.d_model, dtype=torch.float64)
    return torch.cat([basis.T @ p[f"blocks.{i}.mlp.b_out"] for i in range(cfg.n_layers)])


# ----------------------------------------------------------------------------- 7 writer-ones
def fix_writer_ones(ctx: Context) -> None:
    """Condition: every row of every writer into a LayerNorm's input is ⊥ 1 (W·1 = 0).

    Reachable: a = −W·1/d per row (writer-ones).  Unique: translation along 1.  Invariant under
    the later groups: rotations fix 1, head/FFN groups act on the rows from the left."""
    cfg, p = ctx.cfg, ctx.params
    writers = ln_writers(cfg, p)
    if writers:
        ctx.apply(
            "ln-writer-ones",
            "writer-ones",
            Element({w: -p[w].sum(-1) / cfg.d_model for w in writers}, 1.0),
            "every row of every writer into a LayerNorm is ⊥ 1",
        )


def cond_writer_ones(cfg: Config, p: Params) -> torch.Tensor | None:
    writers = ln_writers(cfg, p)
    return torch.cat([p[w].sum(-1).reshape(-1) for w in writers]) if writers else None


# ----------------------------------------------------------------------------- 8 stream rotation
def rotates(cfg: Config) -> bool:
    """The stream rotation is fixed where it is the whole stream group: pre-norm with norms, or a
    tied norm-free stream (untied and norm-free the group is GL(d), not fixed here)."""
    return _applies("stream-rotation", cfg) and (cfg.norm != "none" or cfg.tied)


def _rotation_basis(cfg: Config) -> torch.Tensor | None:
    """The subspace the rotations act on: 1^⊥ under LayerNorm (they fix 1); None for all of ℝ^d
    (the identity basis, not multiplied by: W_E·I is W_E exactly, and for a real vocabulary the
    product is as large as the rotation's Gram itself)."""
    return ones_basis(cfg.d_model) if cfg.norm in LN else None


def _in_basis(x: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
    return x if u is None else x @ u


def fix_stream_rotation(ctx: Context) -> None:
    """Condition: the embedding's Gram matrix Uᵀ·W_Eᵀ·W_E·U is diagonal with descending entries
    (U: an orthonormal basis of the space the rotations act on; 1^⊥ under LayerNorm), and each
    axis' embedding column W_E·u_i has a positive third moment Σ_t (W_E·u_i)_t³.

    Reachable: R = U·V·Uᵀ (+ 11ᵀ/d) with V the eigenvectors of the Gram, signed (stream-rotation;
    after norm-scale γ = 1, so the reader rule C = D_γ⁻¹·R·D_γ is R itself).  Unique when the
    eigenvalues are distinct and no third moment vanishes; otherwise reported.  W_E is moved by no
    later step.  With a reference the rotation is instead the orthogonal Procrustes fit of W_E·U
    to the reference's."""
    cfg, p = ctx.cfg, ctx.params
    if not rotates(cfg) or ctx.reuse("stream-rotation"):
        return
    u = _rotation_basis(cfg)
    ref = _in_basis(ctx.reference["embed.W_E"], u) if ctx.reference is not None else None
    # without a basis (RMSNorm, norm-free) R is Q itself: W_E·R, which the rotation's first product
    # is, was formed for the axes' signs
    q, decisions = gram_axes(ctx, _in_basis(p["embed.W_E"], u), ref, "stream rotation (embedding)", u is None)
    r = q if u is None else u @ q @ u.T
    if cfg.norm in LN:
        r = r + 1.0 / cfg.d_model
    norms = [f"{n}.w" for n in norm_readers(cfg, p)]
    ctx.apply(
        "stream-rotation",
        "stream-rotation",
        Element({"R": r}, 1.0),
        "embedding Gram diagonal, descending, axes signed by their third moment",
        decisions=decisions,
        reads=set(norms),
    )
    forget_products()  # used by the rotation, or (another order of steps) not at all


def cond_stream_rotation(cfg: Config, p: Params) -> torch.Tensor | None:
    if not rotates(cfg):
        return None
    x = _in_basis(p["embed.W_E"], _rotation_basis(cfg))
    g = x.T @ x
    i, j = torch.triu_indices(g.shape[0], g.shape[0], 1)
    return g[i, j]
