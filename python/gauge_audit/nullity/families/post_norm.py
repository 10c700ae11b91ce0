"""Post-norm (BERT) families: per residual segment between two LayerNorms, the writer /
reader constants, segment translations and the ε-broken segment scale.
"""

from __future__ import annotations

from typing import Any

from ..measure import Problem
from .base import LN, Family, Rows, make_family
from .readers import reader_ones, writer_rows
from .stream import Segment, embed_offset_family, translation_family


def post_norm_families(problem: Problem) -> list[Family]:
    """Encoder with post-LN blocks, output = last hidden state (observed directly).

    Segments: the stream x_in feeding block l is read by the attention (W_Q, W_K, W_V) and
    added to the attention output; LN1 reads that sum.  x_mid = LN1(·) is read by the FFN
    and added to its output; LN2 reads that sum.  Only what a LayerNorm reads next can
    lose its all-ones component or its scale; the last LN2's output is observed.
    """
    cfg, p, layout = problem.cfg, problem.params(), problem.layout
    L, norm = cfg.n_layers, cfg.norm
    fams: list[Family] = []
    ln = norm in LN
    emb_tables: list[str] = [t for t in ("embed.W_E", "embed.W_pos", "embed.W_tt") if t in p]
    pairs = [("embed.W_E", "embed.W_pos")] + ([("embed.W_tt", "embed.W_pos")] if "embed.W_tt" in p else [])
    embed_ln = cfg.embed_norm and norm in LN
    fams.append(embed_offset_family(problem, pairs, ones=embed_ln))

    def ffn_prefix(i):
        return f"blocks.{i}.moe" if cfg.experts else f"blocks.{i}.mlp"

    def attn_readers(i):
        return [(f"blocks.{i}.attn.W_{n}", f"blocks.{i}.attn.b_{n}") for n in "QKV"]

    def mlp_readers(i):
        pre = ffn_prefix(i)
        rs: list[tuple[str, str | None]] = [(f"{pre}.W_in", f"{pre}.b_in")]
        if cfg.act == "swiglu":
            rs.append((f"{pre}.W_gate", f"{pre}.b_gate"))
        if cfg.experts:
            rs.append((f"{pre}.W_router", None))
        return rs

    # The norm producing each block's input (None: raw embeddings) and each LN1.
    # (the norm, or None for the raw embedding sum; its readers; the block)
    sources: list[tuple[str | None, Any, int]] = [
        ("embed.ln" if cfg.embed_norm and norm != "none" else None, attn_readers(0), 0)
    ]
    sources += [(f"blocks.{i - 1}.ln2", attn_readers(i), i) for i in range(1, L)]
    mids: list[tuple[str | None, Any, int]] = [(f"blocks.{i}.ln1", mlp_readers(i), i) for i in range(L)]

    # ------------------------------------------------------------ writer ones
    if ln:
        R, count = Rows(layout), 0
        names = list(emb_tables) if embed_ln else []
        for i in range(L):
            names += [
                n
                for n in (
                    f"blocks.{i}.attn.W_O",
                    f"blocks.{i}.attn.b_O",
                    f"{ffn_prefix(i)}.W_out",
                    f"{ffn_prefix(i)}.b_out",
                )
                if n in p
            ]
        for w in names:
            for r in range(writer_rows(p[w]).shape[0]):
                writer_rows(R.at(R.new(), w))[r] = 1.0
                count += 1
        fams.append(
            make_family(
                layout,
                "ln-writer-ones",
                "rows of every writer into a LayerNorm's input",
                count,
                R,
                """What a LayerNorm reads loses its all-ones component: embedding rows (embedding
                         LN), W_O/b_O rows (LN1), W_out/b_out rows (LN2) may add any multiple of 1.""",
            )
        )

    # ------------------------------------------------------------ segment translations
    segments = []
    for n, rs, i in sources:
        if norm == "none" and i > 0:
            opening = [(f"{ffn_prefix(i - 1)}.b_out", "bias")]  # no norm: the previous closing bias
        else:
            opening = [(f"{n}.b", "bias")] if n is not None else [("embed.W_E", "rows")]
        segments.append(
            Segment(opening, rs, f"blocks.{i}.attn.b_O", ln, f"attn {i}", ln=n if norm == "layernorm" else None)
        )
    for n, rs, i in mids:
        opening = [(f"blocks.{i}.attn.b_O", "bias")] if norm == "none" else [(f"{n}.b", "bias")]
        segments.append(
            Segment(opening, rs, f"{ffn_prefix(i)}.b_out", ln, f"ffn {i}", ln=n if norm == "layernorm" else None)
        )
    tr = translation_family(problem, segments)
    if tr is not None:
        fams.append(tr)

    # ------------------------------------------------------------ reader ones
    if ln:
        R, count = Rows(layout), 0
        for n, rs, _ in sources + mids:
            if n is not None:
                count += reader_ones(problem, R, n, rs)
        if count:
            fams.append(
                make_family(
                    layout,
                    "ln-reader-ones",
                    "output width of every reader of a LayerNorm output that can absorb a constant",
                    count,
                    R,
                    reader_ones.__doc__ or "",
                )
            )

    # ------------------------------------------------------------ segment scales (eps-broken)
    if norm != "none":
        R, count = Rows(layout), 0
        if cfg.embed_norm:
            v = R.new()  # the embedding sum, read only by the embedding norm
            for t in emb_tables:
                R.at(v, t)[...] = p[t]
            count += 1
        for idx, (n, rs, i) in enumerate(sources + mids):
            is_mid = idx >= len(sources)
            # the segment's writers: what is added to this norm's output before the next norm
            if is_mid:
                seg_writers = [f"{ffn_prefix(i)}.W_out", f"{ffn_prefix(i)}.b_out"]
            else:
                seg_writers = [f"blocks.{i}.attn.W_O", f"blocks.{i}.attn.b_O"]
            v = R.new()
            if n is None:
                if is_mid:
                    continue
                for t in emb_tables:
                    R.at(v, t)[...] = p[t]
            else:
                if f"{n}.w" not in p:
                    R.rows.pop()
                    continue
                R.at(v, f"{n}.w")[...] = p[f"{n}.w"]
                if f"{n}.b" in p:
                    R.at(v, f"{n}.b")[...] = p[f"{n}.b"]
            for w, _ in rs:
                R.at(v, w)[...] = -p[w]
            for w in seg_writers:
                if w in p:
                    R.at(v, w)[...] = p[w]
            count += 1
        if count:
            fams.append(
                make_family(
                    layout,
                    "segment-scale",
                    "one per norm output that feeds another norm",
                    count,
                    R,
                    """x ↦ c·x on a residual segment (the producing norm's γ, β ×c, its readers ÷c,
                             the segment's writers ×c; or all embedding tables ×c before the embedding
                             norm) is divided out by the next norm — exactly only when ε = 0.""",
                    kind="exact" if cfg.norm_eps == 0 else "eps-broken",
                )
            )
    return fams
