"""Translation-type gauge actions: constants that one tensor adds and another removes.

Each is an abelian group acting by θ ↦ θ + (a vector that depends only on tensors the action does
not move), so its inverse is the negated element and two elements compose by adding.  They are
the continuous families of the nullity theory (``gauge_audit.nullity.families``) that the other
actions do not cover, written as finite group actions:

* ``writer-ones`` — a LayerNorm subtracts the mean, so every row of a writer into a LayerNorm's
  input may add a multiple of the all-ones vector 1 (family ln-writer-ones);
* ``reader-ones`` — a LayerNorm's output y = γ⊙n + β has n ⊥ 1, so y·γ⁻¹ = β·γ⁻¹ is the same for
  every input: a reader column may add γ⁻¹ (1 without affine part) when the constant it then adds
  can be absorbed (ln-reader-ones);
* ``norm-shift-absorbed`` — the LayerNorm shift β ↦ β + δ when some of the norm's readers have no
  bias: they absorb δ through that constant response (the rest of norm-shift);
* ``embed-offset`` — a vector added to every row of an embedding table and subtracted from every
  row of the position table (embed-offset);
* ``router-offset`` — the same vector added to every expert's router column (router-offset);
* ``segment-shift`` — a constant added to one stretch of the residual stream by the bias or β that
  opens it, absorbed by its readers' biases and removed by the bias that closes it
  (stream-translation, where every reader has a bias).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from .base import Action, Element, Params, as64, put, require_shape, updated
from .stream import norm_readers, stream_writers

LN = ("layernorm", "layernorm-noaffine")
Readers = list[tuple[str, str | None]]


def _ffn(cfg: Config, i: int) -> str:
    return f"blocks.{i}.{'moe' if cfg.experts else 'mlp'}"


def _attn_readers(i: int) -> Readers:
    return [(f"blocks.{i}.attn.W_{n}", f"blocks.{i}.attn.b_{n}") for n in "QKV"]


def _ffn_readers(cfg: Config, i: int) -> Readers:
    pre = _ffn(cfg, i)
    out: Readers = [(f"{pre}.W_in", f"{pre}.b_in")]
    if cfg.act == "swiglu":
        out.append((f"{pre}.W_gate", f"{pre}.b_gate"))
    if cfg.experts:
        out.append((f"{pre}.W_router", None))
    return out


def _present(params: Params, readers: Readers) -> Readers:
    return [(w, b if (b is not None and b in params) else None) for w, b in readers if w in params]


def ln_readers(cfg: Config, params: Params) -> dict[str, Readers]:
    """LayerNorm prefix → the readers of exactly that norm's output, with their bias (or None).

    Pre-norm: the stream actions' readers (a tied final norm's reader W_Eᵀ is also a writer and is
    left out).  Post-norm (BERT): the embedding norm and each block's second norm feed the next
    block's attention, each block's first norm feeds its FFN; the last norm's output is observed."""
    if cfg.norm not in LN or cfg.attention_only:
        return {}
    if cfg.pre_norm:
        return norm_readers(cfg, params)
    out = {}
    if cfg.embed_norm:
        out["embed.ln"] = _present(params, _attn_readers(0))
    for i in range(cfg.n_layers):
        if i > 0:
            out[f"blocks.{i - 1}.ln2"] = _present(params, _attn_readers(i))
        out[f"blocks.{i}.ln1"] = _present(params, _ffn_readers(cfg, i))
    return out


def _gamma_inv(params: Params, norm: str, d: int) -> torch.Tensor:
    if f"{norm}.w" not in params:
        return torch.ones(d, dtype=torch.float64)
    gamma = as64(params[f"{norm}.w"])
    if (gamma == 0).any():
        raise GaugeAuditError(f"{norm} has a zero weight entry: its constant response γ⁻¹ is undefined")
    return 1.0 / gamma


def ln_constant(params: Params, norm: str) -> float:
    """c = β·γ⁻¹: what the direction γ⁻¹ adds to a reader's input (0 without an affine part)."""
    if f"{norm}.b" not in params:
        return 0.0
    return float((as64(params[f"{norm}.b"]) / as64(params[f"{norm}.w"])).sum())


def _times_rows(c: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """c·W over the d_model axis (−2) of a reader W (*lead, d, f): shape (*lead, f)."""
    return torch.einsum("d,...df->...f", c, w)


def _plus_columns(w: torch.Tensor, a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """W + a⊗t: the d-vector a added to every output column of W (*lead, d, f), column j scaled by t[..., j]."""
    return w + a[:, None] * t.unsqueeze(-2)


# ----------------------------------------------------------------------------- writer-ones
def ln_writers(cfg: Config, params: Params) -> list[str]:
    """Tensors whose rows are added into the input of a LayerNorm (and go nowhere else)."""
    if cfg.norm not in LN or cfg.attention_only:
        return []
    if cfg.pre_norm:
        # a tied W_E is also read, through an affine final norm: y·1 is then not constant
        return [
            w for w in stream_writers(cfg, params) if not (w == "embed.W_E" and cfg.tied and cfg.norm == "layernorm")
        ]
    names = ["embed.W_E", "embed.W_pos", "embed.W_tt"] if cfg.embed_norm else []
    for i in range(cfg.n_layers):
        names += [f"blocks.{i}.attn.W_O", f"blocks.{i}.attn.b_O", f"{_ffn(cfg, i)}.W_out", f"{_ffn(cfg, i)}.b_out"]
    return [n for n in names if n in params]


def _writer_ones_applies(cfg: Config) -> str | None:
    if cfg.attention_only or cfg.norm not in LN:
        return "only writers into a LayerNorm's input have an invisible all-ones component"
    return None


def _writer_ones_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    return Element(
        {w: 0.1 * torch.randn(params[w].shape[:-1], generator=g, dtype=torch.float64) for w in ln_writers(cfg, params)},
        1.0,
    )


def writer_ones(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ, +) per row of every writer into a LayerNorm's input (embeddings, W_O, b_O, W_out,
    b_out of pre-LN models, except a tied W_E under an affine final norm; for post-LN the tensors
    summed before each norm).

    Acts: row r of writer W ↦ W[r] + a_r·1.

    Why: the all-ones component of the LayerNorm's input is removed by its mean subtraction, and
    nothing else reads that input.
    """
    allowed = set(ln_writers(cfg, params))
    changes = {}
    for w, a in el.parts.items():
        if w not in allowed:
            raise GaugeAuditError(f"{w} is not a writer into a LayerNorm's input in this model")
        require_shape(f"offset for {w}", a, tuple(params[w].shape[:-1]))
        changes[w] = put(as64(params[w]) + as64(a)[..., None], params[w])
    return updated(params, changes)


# ----------------------------------------------------------------------------- reader-ones
def reader_ones_mode(cfg: Config, params: Params, norm: str, w: str, b: str | None) -> str | None:
    """How a reader of LayerNorm ``norm`` absorbs the constant c·t that the direction γ⁻¹⊗t adds:
    ``bias`` (its bias takes −c·t; nothing to take when c = 0), ``key`` (a key column: constant over
    the keys of a query, no RoPE), ``fold`` (a value column: reaches the output as a constant that
    b_O takes), or None (no such direction)."""
    c = ln_constant(params, norm)
    pre = w.rsplit(".", 1)[0]
    if c == 0.0 or b is not None:
        return "bias"
    if w.endswith(".W_K") and cfg.pos != "rope":
        return "key"
    if w.endswith(".W_V") and f"{pre}.b_O" in params:
        return "fold"
    return None


def reader_ones_columns(cfg: Config, params: Params) -> dict[str, tuple[str, str | None, str]]:
    """reader weight → (its norm, its bias, its mode) for every reader that has the direction."""
    out = {}
    for norm, readers in ln_readers(cfg, params).items():
        for w, b in readers:
            mode = reader_ones_mode(cfg, params, norm, w, b)
            if mode is not None:
                out[w] = (norm, b, mode)
    return out


def _reader_ones_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    cols = reader_ones_columns(cfg, params)
    if not cols:
        raise GaugeAuditError("no LayerNorm reader of this model can absorb a constant")
    shape = {w: params[w].shape[:-2] + params[w].shape[-1:] for w in cols}
    return Element({w: 0.1 * torch.randn(shape[w], generator=g, dtype=torch.float64) for w in cols}, 1.0)


def reader_ones(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ, +) per output column of every LayerNorm reader that can absorb a constant.

    Acts: column j of reader W ↦ W[:, j] + t_j·γ⁻¹ (1 without affine part); with c = β·γ⁻¹ the
    reader's output moves by the constant c·t_j, which its bias takes (b_j ↦ b_j − c·t_j), which is
    invisible for a key column (no RoPE), or which b_O takes for a value column
    (b_O ↦ b_O − c·Σ_h t_{j(h)}·W_O[h]).

    Why: y = γ⊙n + β with n ⊥ 1 gives y·γ⁻¹ = Σ n + β·γ⁻¹ = c for every input.
    """
    cols = reader_ones_columns(cfg, params)
    d = cfg.d_model
    changes: dict[str, torch.Tensor] = {}
    for w, t in el.parts.items():
        if w not in cols:
            raise GaugeAuditError(f"{w} is not a LayerNorm reader that can absorb a constant in this model")
        norm, b, mode = cols[w]
        require_shape(f"column offsets for {w}", t, tuple(params[w].shape[:-2] + params[w].shape[-1:]))
        t = as64(t)
        c = ln_constant(params, norm)
        changes[w] = put(_plus_columns(as64(params[w]), _gamma_inv(params, norm, d), t), params[w])
        if c == 0.0 or mode == "key":
            continue
        if mode == "bias":
            assert b is not None  # c ≠ 0 here, and reader_ones_mode gives "bias" then only with a bias
            changes[b] = put(as64(params[b]) - c * t, params[b])
        else:  # fold: every query head of KV group j reads value column t[j]
            pre = w.rsplit(".", 1)[0]
            key = f"{pre}.b_O"
            t_q = t.repeat_interleave(cfg.group_size, dim=0)
            base = as64(changes[key]) if key in changes else as64(params[key])
            changes[key] = put(base - c * torch.einsum("he,hed->d", t_q, as64(params[f"{pre}.W_O"])), params[key])
    return updated(params, changes)


# ----------------------------------------------------------------------------- norm-shift-absorbed
def absorbed_shift_norms(cfg: Config, params: Params) -> list[str]:
    """Affine pre-LayerNorms (not a tied final one) with at least one reader without a bias."""
    if cfg.norm != "layernorm" or not cfg.pre_norm or cfg.attention_only:
        return []
    return [n for n, rs in norm_readers(cfg, params).items() if f"{n}.b" in params and any(b is None for _, b in rs)]


def _absorbed_applies(cfg: Config) -> str | None:
    if cfg.attention_only or cfg.norm != "layernorm" or not cfg.pre_norm:
        return "needs an affine pre-LayerNorm"
    # a tied final norm is not shifted, and without an unembedding the final norm has no reader
    unembed_unbiased = cfg.unembed and not cfg.tied and not cfg.unembed_bias
    if cfg.attn_bias and cfg.mlp_bias and not cfg.experts and not unembed_unbiased:
        return "every reader has a bias (norm-shift covers it)"
    return None


def _absorbed_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    norms = absorbed_shift_norms(cfg, params)
    if not norms:
        raise GaugeAuditError("every LayerNorm reader of this model has a bias (use norm-shift)")
    return Element({n: 0.1 * torch.randn(cfg.d_model, generator=g, dtype=torch.float64) for n in norms}, 1.0)


def norm_shift_absorbed(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ^{d_model}, +) per affine pre-LayerNorm (not a tied final one), readers with or
    without biases.

    Acts: β ↦ β' = β + δ; a reader with a bias b ↦ b − δ·W; a reader without one
    W ↦ W + γ⁻¹⊗u with u = −δ·W / c', c' = β'·γ⁻¹ (needs c' ≠ 0).

    Why: the reader sees y' = y + δ; W + γ⁻¹⊗u adds (y'·γ⁻¹)·u = c'·u = −δ·W to its output, for
    every input, because y'·γ⁻¹ = Σ n + β'·γ⁻¹ = c' (n ⊥ 1).  The inverse element is −δ.
    """
    allowed = set(absorbed_shift_norms(cfg, params))
    readers = norm_readers(cfg, params)
    changes: dict[str, torch.Tensor] = {}
    for norm, delta in el.parts.items():
        if norm not in allowed:
            raise GaugeAuditError(f"{norm} is not an affine pre-LayerNorm with a reader without a bias")
        require_shape(f"shift for {norm}", delta, (cfg.d_model,))
        delta = as64(delta)
        gamma_inv = _gamma_inv(params, norm, cfg.d_model)
        beta = as64(params[f"{norm}.b"]) + delta
        c_new = float((beta * gamma_inv).sum())
        if not abs(c_new) > 1e-12 * float((beta * gamma_inv).abs().sum()):
            raise GaugeAuditError(
                f"the shifted β of {norm} has β·γ⁻¹ = 0: a reader without a bias cannot absorb the shift"
            )
        changes[f"{norm}.b"] = put(beta, params[f"{norm}.b"])
        for w, b in readers[norm]:
            shift = _times_rows(delta, as64(params[w]))
            if b is not None:
                changes[b] = put(as64(params[b]) - shift, params[b])
            else:
                changes[w] = put(_plus_columns(as64(params[w]), gamma_inv, -shift / c_new), params[w])
    return updated(params, changes)


# ----------------------------------------------------------------------------- embed-offset
def offset_tables(cfg: Config, params: Params) -> list[str]:
    """Embedding tables summed with the position table W_pos into the stream (not a tied W_E)."""
    if cfg.attention_only or "embed.W_pos" not in params:
        return []
    tables = ["embed.W_E", "embed.W_tt"] if cfg.normed_sums else (["embed.W_E"] if not cfg.tied else [])
    return [t for t in tables if t in params]


def _offset_applies(cfg: Config) -> str | None:
    if cfg.attention_only or cfg.pos != "learned":
        return "needs learned positions"
    if cfg.tied and cfg.pre_norm:
        return "tied: W_E is also the unembedding"
    return None


def _offset_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    return Element(
        {t: 0.1 * torch.randn(cfg.d_model, generator=g, dtype=torch.float64) for t in offset_tables(cfg, params)}, 1.0
    )


def embed_offset(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ^{d_model}, +) per embedding table summed with the position table.

    Acts: every row of the table (W_E, or BERT's token-type table W_tt) ↦ row + c, every row of
    W_pos ↦ row − c.

    Why: the stream starts as W_E[t] + W_pos[p] (+ W_tt[τ]); each sum is unchanged.
    """
    allowed = set(offset_tables(cfg, params))
    changes: dict[str, torch.Tensor] = {}
    pos = as64(params["embed.W_pos"]) if "embed.W_pos" in params else None
    for table, c in el.parts.items():
        if table not in allowed:
            raise GaugeAuditError(f"{table} is not an embedding table paired with W_pos in this model")
        require_shape(f"offset for {table}", c, (cfg.d_model,))
        changes[table] = put(as64(params[table]) + as64(c), params[table])
        assert pos is not None  # offset_tables lists tables only when embed.W_pos exists
        pos = pos - as64(c)
    if el.parts:
        assert pos is not None
        changes["embed.W_pos"] = put(pos, params["embed.W_pos"])
    return updated(params, changes)


# ----------------------------------------------------------------------------- router-offset
def _router_applies(cfg: Config) -> str | None:
    return None if cfg.experts else "the model has no mixture of experts"


def _router_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    return Element({"c": 0.1 * torch.randn(cfg.n_layers, cfg.d_model, generator=g, dtype=torch.float64)}, 1.0)


def router_offset(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ^{d_model}, +) per MoE router.

    Acts: every expert's router column W_router[:, e] ↦ W_router[:, e] + c.

    Why: every router logit x·W_router[:, e] gains the same x·c; softmax, the top-k choice and the
    renormalised gates ignore a shift common to all experts.
    """
    c = el.parts["c"]
    require_shape("c", c, (cfg.n_layers, cfg.d_model))
    changes = {}
    for i in range(cfg.n_layers):
        key = f"blocks.{i}.moe.W_router"
        if key in params:  # DeepSeek's first layers are dense: no router there
            changes[key] = put(as64(params[key]) + as64(c[i])[:, None], params[key])
    return updated(params, changes)


# ----------------------------------------------------------------------------- segment-shift
@dataclass(frozen=True)
class Segment:
    """A stretch of residual stream: ``opening`` adds a constant to it (a bias or β, or every row
    of an embedding table), ``readers`` read it, ``closing`` (a bias) removes the constant where
    the stretch ends (None: read by the output readers only)."""

    label: str
    opening: str
    readers: tuple[tuple[str, str], ...]
    closing: str | None


def segments(cfg: Config, params: Params) -> list[Segment]:
    """The stretches whose readers all have biases (so a shift is absorbed entirely by biases).
    Stretches read through a norm (pre-norm models with norms) have none: the norm is nonlinear."""
    raw: list[tuple[str, str, Readers, str | None]] = []
    if cfg.attention_only:
        for i in range(1, cfg.n_layers):
            raw.append((f"attn{i}", f"blocks.{i - 1}.attn.b_O", _attn_readers(i), f"blocks.{i}.attn.b_O"))
    elif cfg.normed_sums:
        if cfg.norm != "layernorm":
            return []
        for i in range(cfg.n_layers):
            if i == 0:
                opening = "embed.ln.b" if cfg.embed_norm else "embed.W_E"
            else:
                opening = f"blocks.{i - 1}.ln2.b"
            raw.append((f"attn{i}", opening, _attn_readers(i), f"blocks.{i}.attn.b_O"))
            raw.append((f"ffn{i}", f"blocks.{i}.ln1.b", _ffn_readers(cfg, i), f"{_ffn(cfg, i)}.b_out"))
    elif cfg.norm == "none" and not cfg.tied:
        opening = "embed.W_E"
        for i in range(cfg.n_layers):
            raw.append((f"attn{i}", opening, _attn_readers(i), f"blocks.{i}.attn.b_O"))
            raw.append((f"ffn{i}", f"blocks.{i}.attn.b_O", _ffn_readers(cfg, i), f"{_ffn(cfg, i)}.b_out"))
            opening = f"{_ffn(cfg, i)}.b_out"
        raw.append(("unembed", opening, [("unembed.W_U", "unembed.b_U")], None))
    out = []
    for label, opening, readers, closing in raw:
        if opening not in params or (closing is not None and closing not in params):
            continue
        rs = [(w, b) for w, b in readers if w in params]
        if all(b in params for _, b in rs):
            # every bias is in params, so none is None
            out.append(Segment(label, opening, cast("tuple[tuple[str, str], ...]", tuple(rs)), closing))
    return out


def _segment_applies(cfg: Config) -> str | None:
    if not cfg.attention_only and cfg.pre_norm and cfg.norm != "none":
        return "the stream is read through norms, which do not commute with a shift"
    if not (cfg.attn_bias and cfg.out_bias and (cfg.attention_only or cfg.mlp_bias)):
        return "needs biases on every reader and on the closing projections"
    if cfg.attention_only and cfg.n_layers < 2:
        return "a single attention layer has no inner stretch of stream"
    if cfg.normed_sums and cfg.norm != "layernorm":
        return "post-norm without an affine LayerNorm has no shift β to open a stretch"
    if cfg.experts:
        return "the MoE router has no bias to absorb a shift"
    if not cfg.attention_only and cfg.pre_norm and cfg.tied:
        return "tied: W_E is also the unembedding"
    return None


def _segment_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    return Element(
        {s.label: 0.1 * torch.randn(cfg.d_model, generator=g, dtype=torch.float64) for s in segments(cfg, params)}, 1.0
    )


def segment_shift(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ^{d_model}, +) per stretch of residual stream whose readers all have biases (the
    input of every post-LN sub-block, opened by the previous norm's β; the stream between two
    attention layers; the stream of a norm-free decoder).

    Acts: the opening bias or β ↦ + c (an opening embedding table: every row + c); every reader's
    bias b ↦ b − c·W (the value bias too); the closing bias ↦ − c.

    Why: the readers see x + c and their biases remove c·W; the stretch ends in
    x + c + f(x) + b_close − c, the same sum as before.
    """
    by_label = {s.label: s for s in segments(cfg, params)}
    changes: dict[str, torch.Tensor] = {}

    def cur(name):
        return as64(changes[name]) if name in changes else as64(params[name])

    for label, c in el.parts.items():
        if label not in by_label:
            raise GaugeAuditError(
                f"{label} is not a stretch of stream with biased readers in this model "
                f"(known: {', '.join(by_label) or 'none'})"
            )
        seg = by_label[label]
        require_shape(f"shift for {label}", c, (cfg.d_model,))
        c = as64(c)
        changes[seg.opening] = put(cur(seg.opening) + c, params[seg.opening])
        for w, b in seg.readers:
            changes[b] = put(cur(b) - _times_rows(c, as64(params[w])), params[b])
        if seg.closing is not None:
            changes[seg.closing] = put(cur(seg.closing) - c, params[seg.closing])
    return updated(params, changes)


# Their elements are keyed by the tensors they touch (embeddings and every block at once):
# applied to the whole model (element_layout "whole"), not block by block.
ACTIONS = [
    Action(
        "writer-ones",
        "(ℝ,+) per row of every writer into a LayerNorm",
        True,
        _writer_ones_applies,
        _writer_ones_sample,
        writer_ones,
        generic_kappa=False,
        element_layout="whole",
    ),
    Action(
        "reader-ones",
        "(ℝ,+) per absorbing column of every LayerNorm reader",
        True,
        lambda cfg: _writer_ones_applies(cfg) and "only LayerNorm outputs have a constant response",
        _reader_ones_sample,
        reader_ones,
        generic_kappa=False,
        element_layout="whole",
    ),
    Action(
        "norm-shift-absorbed",
        "(ℝ^d,+) per affine pre-LayerNorm, readers with or without biases",
        True,
        _absorbed_applies,
        _absorbed_sample,
        norm_shift_absorbed,
        generic_kappa=False,
        element_layout="whole",
    ),
    Action(
        "embed-offset",
        "(ℝ^d,+) per embedding table paired with W_pos",
        True,
        _offset_applies,
        _offset_sample,
        embed_offset,
        generic_kappa=False,
        element_layout="whole",
    ),
    Action(
        "router-offset",
        "(ℝ^d,+) per MoE router",
        True,
        _router_applies,
        _router_sample,
        router_offset,
        generic_kappa=False,
    ),
    Action(
        "segment-shift",
        "(ℝ^d,+) per stretch of stream with biased readers",
        True,
        _segment_applies,
        _segment_sample,
        segment_shift,
        generic_kappa=False,
        element_layout="whole",
    ),
]
