"""The reference families in the terms of a derived description.

:mod:`.derived` reads an architecture off transformers' modules as a :class:`~.derived.Description`
— what every tensor is: stream readers and writers, heads with their KV groups and rotary part,
norms with their kind and what they read, hidden spaces of FFNs and experts.  The reference
families are described by their :class:`~.config.Config` switches; :func:`description` states the
same thing per tensor, from those switches alone, so the candidate families, the measurement of
the group and its completeness (:mod:`..nullity.found`) run on the project's own forward exactly
as on transformers' (:class:`FamilyModel`).

Heads are described as rows of projections (nn.Linear's layout: a head's coordinates are
consecutive rows); the project stores them per head (``W_Q`` is (heads, d_model, d_head)).
:func:`rows` and :func:`per_head` move between the two without arithmetic — reshapes, transposes
and one concatenation (latent attention's per-head key and value up-projections side by side, as
transformers stores them), so derivatives pass straight through — and the model computes on the
per-head tensors it always has.

What a description cannot say yet is refused in one line (:func:`description`): a post-LN block
n(x + f(x)) (BERT), an output that is the stream itself (an encoder, an attention-only stack) and
interleaved rotary planes of softmax heads (whose discrete turns are stated for half-split ones).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import GaugeAuditError
from .config import Config
from .deepseek import DeepseekConfig, as_latent
from .derived import Description, Heads, Hidden, Latent, LatentHeads, Norm, Reader, Writer, head_starts
from .families import family_of, param_shapes
from .params import init_params

# the per-head tensors as rows: (heads, a, b) → (heads·b, a) for projections (one head's b
# outputs are consecutive rows), (heads, b, d) → (d, heads·b) for the one that writes the stream,
# (heads, b) → (heads·b,) for their biases — with the attribute that counts the heads; a matrix
# x·W (in, out) → its nn.Linear rows (out, in): a router (a row per expert), latent down-projections
_HEADS = {
    "W_Q": ("in", "n_heads"),
    "W_UQ": ("in", "n_heads"),
    "W_K": ("in", "n_kv_heads"),
    "W_V": ("in", "n_kv_heads"),
    "W_O": ("out", "n_heads"),
    "b_Q": ("bias", "n_heads"),
    "b_K": ("bias", "n_kv_heads"),
    "b_V": ("bias", "n_kv_heads"),
}
_TRANSPOSED = ("W_router", "W_DQ", "W_DKV", "W_KR")
# where the norms after a sublayer live: normed outputs only (OLMo 2), or after a pre-norm (Gemma)
_POST = {"output": ("ln1", "ln2"), "sandwich": ("ln1_post", "ln2_post")}
_KINDS = {
    "layernorm": "layernorm",
    "layernorm-noaffine": "layernorm-weightless",
    "rmsnorm": "rms",
    "rmsnorm-noweight": "weightless",
}
# latent attention's key and value up-projections, per head [key nope | value] in one tensor as rows
# (transformers' kv_b_proj): W_UK (heads, r, nope) and W_UV (heads, r, v) side by side
_UKV = "W_UKV"


def _split(name: str) -> tuple[str, str]:
    prefix, _, leaf = name.rpartition(".")
    return prefix, leaf


def rows(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-head tensors as rows of projections (reshapes, transposes and one concatenation; the
    rest as they are)."""
    out = {}
    for name, t in params.items():
        prefix, leaf = _split(name)
        kind = _HEADS.get(leaf, (None,))[0]
        if kind == "in":
            out[name] = t.permute(0, 2, 1).reshape(-1, t.shape[1])
        elif kind == "out":
            out[name] = t.reshape(-1, t.shape[2]).T
        elif kind == "bias":
            out[name] = t.reshape(-1)
        elif leaf in _TRANSPOSED:
            out[name] = t.T
        elif leaf == "W_UK":
            kv = torch.cat([t, params[f"{prefix}.W_UV"]], dim=2)
            out[f"{prefix}.{_UKV}"] = kv.permute(0, 2, 1).reshape(-1, t.shape[1])
        elif leaf != "W_UV":
            out[name] = t
    return out


def per_head(cfg: Config, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`rows` undone: the tensors in the project's own layout."""
    out = {}
    for name, t in params.items():
        prefix, leaf = _split(name)
        kind, count = _HEADS.get(leaf, (None, ""))
        if kind == "in":
            out[name] = t.reshape(getattr(cfg, count), -1, t.shape[1]).permute(0, 2, 1)
        elif kind == "out":
            out[name] = t.T.reshape(getattr(cfg, count), -1, t.shape[0])
        elif kind == "bias":
            out[name] = t.reshape(getattr(cfg, count), -1)
        elif leaf in _TRANSPOSED:
            out[name] = t.T
        elif leaf == _UKV:
            kv = t.reshape(cfg.n_heads, -1, t.shape[1]).permute(0, 2, 1)
            nope = as_latent(cfg).nope_dim
            out[f"{prefix}.W_UK"], out[f"{prefix}.W_UV"] = kv[..., :nope], kv[..., nope:]
        else:
            out[name] = t
    return out


@dataclass
class FamilyModel:
    """A reference family's own forward at one float64 point, its tensors as :func:`rows`: what
    :func:`..nullity.found.measure` asks of a model (as of transformers' :class:`~.derived.HFModel`)."""

    name: str
    cfg: Config
    params: dict[str, torch.Tensor]
    source: str

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return self.params

    @property
    def size(self) -> int:
        return sum(v.numel() for v in self.params.values())

    @property
    def vocab(self) -> int:
        return self.cfg.vocab

    def logits(self, params: dict, ids: torch.Tensor) -> torch.Tensor:
        return family_of(self.cfg).forward(per_head(self.cfg, params), self.cfg, {"tokens": ids})


def generic_model(cfg: Config, seed: int) -> FamilyModel:
    """``cfg`` at the seeded generic point of its family (norm weights spread around 1, biases
    non-zero: the point every reference measurement starts from)."""
    native = init_params(param_shapes(cfg), seed, torch.device("cpu"), torch.float64)
    return FamilyModel(cfg.family, cfg, rows(native), f"a generic point (seed {seed})")


def description(cfg: Config) -> Description:
    """What every tensor of a reference-family model is, from its switches (names in :func:`rows`)."""

    def refuse(why: str) -> GaugeAuditError:
        return GaugeAuditError(f"{cfg.family}: no per-tensor description of {why}")

    if cfg.outputs_stream or not cfg.unembed:
        raise refuse("a model whose output is the stream itself")
    if cfg.normed_sums:
        raise refuse("post-LN blocks n(x + f(x))")
    if cfg.pos == "rope" and cfg.rope_style != "half" and not cfg.latent_attention:
        raise refuse("interleaved rotary planes (heads are described with half-split ones)")
    if cfg.n_types or cfg.embed_norm:
        raise refuse("token-type embeddings or an embedding norm")
    shapes = param_shapes(cfg)

    def opt(name: str) -> str | None:
        return name if name in shapes else None

    def norm(prefix: str, reads: str) -> Norm | None:
        if cfg.norm == "none":
            return None
        return Norm(prefix, opt(f"{prefix}.w"), opt(f"{prefix}.b"), _KINDS[cfg.norm], reads)

    tied = cfg.tied
    head = "embed.W_E" if tied else "unembed.W_U"
    desc = Description(cfg.family, cfg.d_model, cfg.n_layers, cfg.vocab, "embed.W_E", head, tied, None)
    desc.final_norm = norm("ln_final", "stream")
    desc.writers.append(Writer("embed.W_E", 1))
    desc.tables.append("embed.W_E")
    if cfg.pos == "learned":
        desc.writers.append(Writer("embed.W_pos", 1))
        desc.tables.append("embed.W_pos")
    # the unembedding reads the final norm's output: W_U (d, vocab), or W_E (vocab, d) itself when tied
    desc.readers.append(Reader(head, 1 if tied else 0, desc.final_norm, opt("unembed.b_U")))
    desc.residual = "parallel" if cfg.parallel_residual else "serial"
    for i in range(cfg.n_layers):
        p = f"blocks.{i}"
        pre_a = norm(f"{p}.ln1", "stream" if cfg.parallel_residual else "stream-mixer") if cfg.normed_inputs else None
        pre_f = norm(f"{p}.ln2", "stream" if cfg.parallel_residual else "stream-ffn") if cfg.normed_inputs else None
        desc.mixers.append("latent attention" if cfg.latent_attention else "attention")
        mix = _latent(desc, as_latent(cfg), i, pre_a, opt) if cfg.latent_attention else _heads(desc, cfg, i, pre_a, opt)
        ffn = _ffn(desc, cfg, i, pre_f, opt)
        desc.writers += [mix, *ffn]
        if cfg.normed_outputs:
            for name, ws, reads in zip(_POST[cfg.norm_placement], ([mix], ffn), ("mixer-out", "ffn-out")):
                post = norm(f"{p}.{name}", reads)
                if post is not None:
                    desc.post_norms.append(post)
                    desc.post_writers[post.module] = list(ws)
    desc.placed = _placed(desc)
    desc.unplaced = [(n, "no role in the description") for n in _row_names(shapes) if n not in desc.placed]
    return desc


def _heads(desc: Description, cfg: Config, i: int, norm: Norm | None, opt) -> Writer:
    """Softmax attention's heads as rows, its stream readers; returns its writer."""
    a, e = f"blocks.{i}.attn", cfg.d_head
    qk = {
        side: Norm(f"{a}.{side}_norm", f"{a}.{side}_norm", None, "rms", "heads") if cfg.qk_norm != "none" else None
        for side in ("q", "k")
    }
    h = Heads(
        layer=i,
        q=f"{a}.W_Q",
        k=f"{a}.W_K",
        v=f"{a}.W_V",
        o=f"{a}.W_O",
        qb=opt(f"{a}.b_Q"),
        kb=opt(f"{a}.b_K"),
        vb=opt(f"{a}.b_V"),
        ob=opt(f"{a}.b_O"),
        n_heads=cfg.n_heads,
        n_kv=cfg.n_kv_heads,
        head_dim=e,
        q_stride=e,
        rotary=(cfg.rotary_dim or e) if cfg.pos == "rope" else 0,
        q_norm=qk["q"],
        k_norm=qk["k"],
        qk_norm=cfg.qk_norm,
        sinks=None,
        **head_starts(None, cfg.n_heads, cfg.n_kv_heads, e, e),
    )
    desc.heads.append(h)
    desc.readers += [Reader(h.q, 1, norm, h.qb), Reader(h.k, 1, norm, h.kb), Reader(h.v, 1, norm, h.vb)]
    return Writer(h.o, 0, h.ob)


def _latent(desc: Description, cfg: DeepseekConfig, i: int, norm: Norm | None, opt) -> Writer:
    """Multi-head latent attention: the query read through its latent (or directly), the keys' and
    values' latent, the shared rotary key; returns the writer."""
    a = f"blocks.{i}.attn"
    q = f"{a}.W_UQ" if cfg.q_lora_rank else f"{a}.W_Q"
    downs = [(f"{a}.W_DKV", opt(f"{a}.b_DKV")), (f"{a}.W_KR", opt(f"{a}.b_KR"))]
    if cfg.q_lora_rank:
        downs.insert(0, (f"{a}.W_DQ", opt(f"{a}.b_DQ")))
        qn = Norm(f"{a}.q_norm", f"{a}.q_norm", None, "rms", "latent")
        desc.latents.append(Latent(i, "query", f"{a}.W_DQ", opt(f"{a}.b_DQ"), 0, cfg.q_lora_rank, qn, (q,)))
    else:
        downs.insert(0, (q, None))
    kvn = Norm(f"{a}.kv_norm", f"{a}.kv_norm", None, "rms", "latent")
    kv_b = f"{a}.{_UKV}"
    desc.latents.append(Latent(i, "key-value", f"{a}.W_DKV", opt(f"{a}.b_DKV"), 0, cfg.kv_lora_rank, kvn, (kv_b,)))
    desc.readers += [Reader(w, 1, norm, b) for w, b in downs]
    rope = cfg.d_head  # the rotary key: W_KR's rows, from the first
    desc.latent_heads.append(
        LatentHeads(
            i, q, f"{a}.W_KR", kv_b, f"{a}.W_O", cfg.n_heads, cfg.nope_dim, rope, cfg.v_dim, 0, opt(f"{a}.b_KR")
        )
    )
    return Writer(f"{a}.W_O", 0, opt(f"{a}.b_O"))


def _ffn(desc: Description, cfg: Config, i: int, norm: Norm | None, opt) -> list[Writer]:
    """The layer's FFNs — a dense one (``mlp``), routed experts (``moe``), a shared expert beside them
    (``shared``), whichever it has: readers (the stream is axis 0 of a (d, f) input, 1 of an
    expert's (E, d, f)), hidden units, writers."""
    out = []
    for m, experts in ((f"blocks.{i}.mlp", 0), (f"blocks.{i}.moe", cfg.experts), (f"blocks.{i}.shared", 0)):
        if opt(f"{m}.W_out") is None:
            continue
        lead = 1 if experts else 0  # the expert axis in front
        units: list[tuple[str, int]] = []
        biases: list[tuple[str, str]] = []
        for w, b in (("W_in", "b_in"), ("W_gate", "b_gate")):
            if opt(f"{m}.{w}") is None:
                continue
            bias = opt(f"{m}.{b}")
            desc.readers.append(Reader(f"{m}.{w}", lead, norm, None if experts else bias))
            units.append((f"{m}.{w}", lead + 1))
            if bias:
                units.append((bias, lead))
                biases.append((bias, f"{m}.{w}"))
        out_bias = opt(f"{m}.b_out")
        writer = Writer(f"{m}.W_out", lead + 1, out_bias)
        out.append(writer)
        if not experts:
            name = f"layer {i} {'shared expert' if m.endswith('shared') else 'FFN'}"
            desc.hidden.append(Hidden(name, tuple(units), ((writer.param, 0),), layer=i, biases=tuple(biases)))
            continue
        router, choice = f"{m}.W_router", opt(f"{m}.b_router")
        desc.readers.append(Reader(router, 1, norm))
        if choice:  # DeepSeek V3's correction bias: it only chooses the experts, never scales a gate
            desc.selection.append(choice)
        per = tuple(x for x in (out_bias, choice) if x)
        hidden = Hidden(f"layer {i} experts", tuple(units), ((writer.param, 1),), experts, router, per_expert=per)
        desc.hidden.append(replace(hidden, layer=i, biases=tuple(biases)))
    return out


def _row_names(shapes: dict) -> list[str]:
    """The tensors' names in :func:`rows`: latent attention's W_UK and W_UV are one."""
    out = []
    for name in shapes:
        prefix, leaf = _split(name)
        if leaf == "W_UK":
            out.append(f"{prefix}.{_UKV}")
        elif leaf != "W_UV":
            out.append(name)
    return out


def _placed(desc: Description) -> set[str]:
    names = {desc.embed, desc.head, *desc.tables, *desc.selection}
    names |= {r.param for r in desc.readers} | {r.bias for r in desc.readers if r.bias}
    names |= {w.param for w in desc.writers} | {w.bias for w in desc.writers if w.bias}
    norms = [r.norm for r in desc.readers] + desc.post_norms + [desc.final_norm]
    norms += [n for h in desc.heads for n in (h.q_norm, h.k_norm)] + [lt.norm for lt in desc.latents]
    names |= {x for n in norms if n is not None for x in (n.weight, n.bias) if x}
    names |= {p for hd in desc.hidden for p, _ in (*hd.readers, *hd.writers)}
    names |= {x for lt in desc.latents for x in (lt.down, lt.down_bias, *lt.readers) if x}
    names |= {x for mh in desc.latent_heads for x in (mh.q, mh.kv_a, mh.kv_b, mh.o)}
    return names
