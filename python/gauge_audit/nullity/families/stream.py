"""Norm and residual-stream families of pre-norm models: norm-scale, norm-shift,
ln-reader-ones, ln-writer-ones, embed-offset, the stream rotation / GL (stream-rotation,
stream-gl), stream-translation and the ε-broken stream-scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..measure import Problem
from .base import AFFINE, LN, Family, Rows, complement_of_ones, has_param, is_router, make_family, null_rows
from .first_block import tied_unembed_family
from .readers import (
    pre_norm_readers,
    pre_norm_writers,
    reader_ones,
    reader_rows,
    reader_value,
    stream_map_vector,
    writer_rows,
)


def pre_norm_families(problem: Problem) -> list[Family]:
    """Stream and norm families of pre-norm decoders (gpt2, llama, qwen, moe)."""
    cfg, p, layout = problem.cfg, problem.params(), problem.layout
    d, L = cfg.d_model, cfg.n_layers
    readers = pre_norm_readers(cfg, p)
    writers = pre_norm_writers(cfg, p)
    tied, norm = cfg.tied, cfg.norm
    fams: list[Family] = []
    transformable = {n: rs for n, rs in readers.items() if not (tied and n == "ln_final")}

    # ---------------------------------------------------------------- norm scale
    if norm in AFFINE:
        R = Rows(layout)
        for n in transformable:
            for i in range(d):
                v = R.new()
                R.at(v, f"{n}.w")[i] = p[f"{n}.w"][i]
                if f"{n}.b" in p:
                    R.at(v, f"{n}.b")[i] = p[f"{n}.b"][i]
                for w, _ in transformable[n]:
                    reader_rows(R, v, w)[i] = -reader_value(p, w)[i]
        k = len(transformable)
        fams.append(
            make_family(
                layout,
                "norm-scale",
                "(2L+1)·d" if not tied else "2L·d",
                k * d,
                R,
                """Per weighted pre-norm: γ⊙s, β⊙s and every reader diag(s)⁻¹·W (the readers see
                         (n(x)⊙γ⊙s + β⊙s)·diag(s)⁻¹·W = (n(x)⊙γ + β)·W).  Not for a tied final norm, whose
                         reader W_Eᵀ is also a writer.""",
            )
        )

    # ---------------------------------------------------------------- norm shift (affine LayerNorm)
    if norm == "layernorm":
        R = Rows(layout)
        for n, rs in transformable.items():
            gamma, beta = p[f"{n}.w"], p[f"{n}.b"]
            c = float((beta / gamma).sum())
            for i in range(d):
                v = R.new()
                R.at(v, f"{n}.b")[i] = 1.0
                for w, b in rs:
                    row = reader_value(p, w)[i]  # (*rest): what β_i adds to the reader's output
                    if b is not None:
                        R.at(v, b)[...] = -row
                    else:
                        # dW = γ⁻¹ ⊗ u with u = −row/(β·γ⁻¹): the reader's new all-ones response
                        # (β·γ⁻¹)·u cancels δβ·W.
                        reader_rows(R, v, w)[...] = (1.0 / gamma).reshape(d, *([1] * row.dim())) * (-row / c)
        k = len(transformable)
        fams.append(
            make_family(
                layout,
                "norm-shift",
                "(2L+1)·d" if not tied else "2L·d",
                k * d,
                R,
                """Per affine LayerNorm: β ↦ β + δ.  A reader with a bias absorbs it (b ↦ b − δ·W);
                         a reader without one absorbs it in its weights: LayerNorm's output y = γ⊙n + β lies
                         in the hyperplane y·γ⁻¹ = β·γ⁻¹ (n ⊥ 1), so W ↦ W + γ⁻¹⊗u changes the reader's
                         output by the constant (β·γ⁻¹)·u, and u = −δ·W/(β·γ⁻¹) cancels δ·W.  Exists for
                         every affine LN (generic β·γ⁻¹ ≠ 0), biases or not.""",
            )
        )

    # ---------------------------------------------------------------- reader ones (LayerNorm)
    if norm in LN:
        R, count = Rows(layout), 0
        for n, rs in readers.items():
            if tied and n == "ln_final":
                continue  # W_E rows along 1: counted with the writers (noaffine) / not flat (affine)
            count += reader_ones(problem, R, n, rs)
        if count:
            fams.append(
                make_family(
                    layout,
                    "ln-reader-ones",
                    "Σ over LN readers of their output width"
                    + (" (readers that can absorb a constant)" if norm == "layernorm" else ""),
                    count,
                    R,
                    reader_ones.__doc__ or "",
                )
            )

    # ---------------------------------------------------------------- writer ones (LayerNorm)
    if norm in LN:
        R = Rows(layout)
        count = 0
        for w in writers:
            if w == "embed.W_E" and tied and norm == "layernorm":
                continue  # W_E is also read by an affine final norm: y·1 = γ·n + β·1 is not constant
            rows = writer_rows(p[w]).shape[0]
            for r in range(rows):
                v = R.new()
                writer_rows(R.at(v, w))[r] = 1.0
                count += 1
        # Without b_O, a constant w added to the values (through b_V, or through W_V's reader-ones
        # under an affine LN) reaches the stream as Σ_h w·W_O[h]; the w whose image is ∝ 1 are flat.
        if "blocks.0.attn.b_O" not in p and ("blocks.0.attn.b_V" in p or norm == "layernorm"):
            for i in range(L):
                pre, ln1 = f"blocks.{i}.attn", f"blocks.{i}.ln1"
                M = torch.zeros(cfg.n_kv_heads * cfg.d_head, d, dtype=torch.float64)
                for h in range(cfg.n_heads):
                    j = h // cfg.group_size
                    M[j * cfg.d_head : (j + 1) * cfg.d_head] += p[f"{pre}.W_O"][h]
                for wc in null_rows((M - M.mean(-1, keepdim=True)).T, M.shape[0]):
                    v = R.new()
                    w = wc.reshape(cfg.n_kv_heads, cfg.d_head)
                    if f"{pre}.b_V" in p:
                        R.at(v, f"{pre}.b_V")[...] = w
                    else:
                        bg = float((p[f"{ln1}.b"] / p[f"{ln1}.w"]).sum())
                        R.at(v, f"{pre}.W_V")[...] = (1.0 / p[f"{ln1}.w"])[None, :, None] * (w / bg)[:, None, :]
                    count += 1
        fams.append(
            make_family(
                layout,
                "ln-writer-ones",
                "rows of every stream writer (W_E, W_pos, W_O, b_O, "
                "W_out, b_out)" + (" except W_E" if tied and norm == "layernorm" else ""),
                count,
                R,
                """Every reader of the residual stream is a LayerNorm, which subtracts the mean:
                         the all-ones component of the stream is invisible, so every row of every writer
                         may add any multiple of 1.""",
            )
        )

    # ---------------------------------------------------------------- embedding offset
    if "embed.W_pos" in p and not tied:
        fams.append(embed_offset_family(problem, [("embed.W_E", "embed.W_pos")], ones=norm in LN))

    # ---------------------------------------------------------------- translations (no norm)
    if norm == "none":
        segs = []
        # the first stretch is opened by a whole embedding table (W_pos when W_E is also the unembedding)
        opening = [("embed.W_pos" if tied else "embed.W_E", "rows")]
        for i in range(L):
            b = f"blocks.{i}"
            ffn = f"{b}.moe" if cfg.experts else f"{b}.mlp"
            segs.append(Segment(opening, readers[f"{b}.ln1"], f"{b}.attn.b_O", False, f"attn {i}"))
            segs.append(Segment([(f"{b}.attn.b_O", "bias")], readers[f"{b}.ln2"], f"{ffn}.b_out", False, f"ffn {i}"))
            opening = [(f"{ffn}.b_out", "bias")]
        segs.append(Segment(opening, readers["ln_final"], None, False, "unembed", final=True))
        tr = translation_family(problem, segs)
        if tr is not None:
            fams.append(tr)

    # ---------------------------------------------------------------- stream rotation / GL
    rot = _stream_map_family(problem, readers, writers)
    if rot is not None:
        fams.append(rot)
    tu = tied_unembed_family(problem, readers, writers)
    if tu is not None:
        fams.append(tu)

    # ---------------------------------------------------------------- stream scale
    if norm != "none" and not (tied and norm not in AFFINE):
        R = Rows(layout)
        v = R.new()
        for w in writers:
            R.at(v, w)[...] = p[w]
        if tied:
            for t in ("w", "b"):
                if f"ln_final.{t}" in p:
                    R.at(v, f"ln_final.{t}")[...] = -p[f"ln_final.{t}"]
        fams.append(
            make_family(
                layout,
                "stream-scale",
                "1",
                1,
                R,
                """Every writer ×c scales the stream, which every norm divides out — exactly only
                         when ε = 0 (n(c·x) = x/√(mean x² + ε/c²)).  Tied: the final γ, β ×1/c keep the
                         logits.""",
                kind="exact" if cfg.norm_eps == 0 else "eps-broken",
            )
        )
    return fams


def embed_offset_family(problem: Problem, pairs: list[tuple[str, str]], ones: bool) -> Family:
    d = problem.cfg.d_model
    basis = complement_of_ones(d) if ones else torch.eye(d, dtype=torch.float64)
    R = Rows(problem.layout)
    for a, b in pairs:
        for c in basis:
            v = R.new()
            R.at(v, a)[...] = c
            R.at(v, b)[...] = -c
    n = len(pairs)
    formula = ("(d−1)" if ones else "d") + (f"·{n}" if n > 1 else "")
    return make_family(
        problem.layout,
        "embed-offset",
        formula,
        n * basis.shape[0],
        R,
        """The stream starts as W_E[t] + W_pos[p] (+ W_tt[τ]): a vector c added to every row of
                one table and subtracted from every row of W_pos leaves every sum unchanged (along 1 it
                is already a writer-ones direction when a LayerNorm follows).""",
    )


def _stream_map_family(problem: Problem, readers: dict, writers: list[str]) -> Family | None:
    """so(d) / so(1^⊥) / gl(d) acting on the residual stream (pre-norm)."""
    cfg, layout = problem.cfg, problem.layout
    d, norm, tied = cfg.d_model, cfg.norm, cfg.tied
    if tied and norm in AFFINE:
        return None
    if norm == "none":
        if tied:
            gens = skew_basis(torch.eye(d, dtype=torch.float64))
            name, formula = "stream-rotation", "d(d−1)/2"
        else:
            gens = []
            for i in range(d):
                for j in range(d):
                    a = torch.zeros(d, d, dtype=torch.float64)
                    a[i, j] = 1.0
                    gens.append(a)
            name, formula = "stream-gl", "d²"
    elif norm in LN:
        gens = skew_basis(complement_of_ones(d).T)
        name, formula = "stream-rotation", "(d−1)(d−2)/2"
    else:
        gens = skew_basis(torch.eye(d, dtype=torch.float64))
        name, formula = "stream-rotation", "d(d−1)/2"
    R = Rows(layout)
    for a in gens:
        stream_map_vector(problem, R, R.new(), a, readers, writers)
    doc = {
        "stream-gl": """Without norms the stream is read only linearly: any invertible A with writers W·A
                         and readers A⁻¹·W.""",
        "stream-rotation": """Norm cores commute with isometries of the stream (LayerNorm: those fixing 1).
                         Writers W·R; for a norm with weight γ, C = D_γ⁻¹·R·D_γ, β·C and readers C⁻¹·W (the
                         corrected rule).  Tied with an affine final norm: none (R would have to commute
                         with diag(γ_final)).""",
    }[name]
    return make_family(layout, name, formula, len(gens), R, doc)


def skew_basis(u: torch.Tensor) -> list[torch.Tensor]:
    """U·(E_ab − E_ba)·Uᵀ for a < b: a basis of so(range U)."""
    m = u.shape[1]
    out = []
    for a in range(m):
        for b in range(a + 1, m):
            out.append(torch.outer(u[:, a], u[:, b]) - torch.outer(u[:, b], u[:, a]))
    return out


@dataclass
class Segment:
    """A stretch of residual stream: opened by ``opening`` (a bias / β that adds a constant, or
    a whole embedding table), read by ``readers``, closed by the bias ``closing`` that writes
    into the next stretch.  ``next_ln``: the next stretch is read only through a LayerNorm (a
    constant along 1 may pass).  ``ln``: the affine LayerNorm whose output this stretch is
    (its readers can then absorb any constant through their weights, see :func:`reader_ones`).
    ``final``: the stretch is read by the output readers only, nothing to close."""

    opening: list[tuple[str, str]]
    readers: list[tuple[str, str | None]]
    closing: str | None
    next_ln: bool
    label: str
    final: bool = False
    ln: str | None = None


def translation_family(problem: Problem, segments: list[Segment]) -> Family | None:
    """x ↦ x + c on one stretch of the stream, undone where the stretch ends.

    A constant c added to the stretch (by the bias or β that opens it, or by every row of an
    embedding table) reaches each reader as the constant c·W.  A reader can absorb a
    constant if it has a bias (b ↦ b − c·W), or if it reads an affine LayerNorm's output
    (W ↦ W + γ⁻¹⊗u adds the constant (β·γ⁻¹)·u); a key reader needs nothing without RoPE
    (q·(c·W_K) is constant over the keys of a query); the MoE router only needs c·W_router
    ∝ 1 (softmax ignores a uniform shift); any other reader forces c·W = 0.  The values'
    constant w (free if the value reader can absorb, else c·W_V) reaches the output as
    Σ_h w_{j(h)}·W_O[h], because attention rows sum to 1.  At the end of the stretch the
    total constant c + Σ_h w·W_O[h] is removed by the closing bias, or, without one, must
    vanish — up to a multiple of 1 when a LayerNorm reads next.  The allowed (c, w) form
    the null space of these linear constraints; each basis vector is one generator.
    """
    cfg, p, layout = problem.cfg, problem.params(), problem.layout
    d, e, nkv = cfg.d_model, cfg.d_head, cfg.n_kv_heads
    R, count, parts = Rows(layout), 0, []
    eye = torch.eye(d, dtype=torch.float64)
    for seg in segments:
        if any(name not in p for name, _ in seg.opening):
            continue
        readers = [(w, b if (b is not None and b in p) else None) for w, b in seg.readers if has_param(p, w)]
        ln = seg.ln if (seg.ln is not None and f"{seg.ln}.b" in p and f"{seg.ln}.w" in p) else None
        closing = seg.closing if (seg.closing is not None and seg.closing in p) else None

        def absorbs(w, b, ln=ln):
            return b is not None or ln is not None

        v_reader = next(((w, b) for w, b in readers if w.endswith(".W_V")), None)
        with_w = v_reader is not None and absorbs(*v_reader) and closing is None and not seg.final
        M: torch.Tensor | None = None  # set exactly when the segment has a W_V reader (v_reader)
        if v_reader is not None:
            pre = v_reader[0].rsplit(".", 1)[0]
            M = torch.zeros(nkv * e, d, dtype=torch.float64)  # value constant (per KV head) ↦ output
            for h in range(cfg.n_heads):
                j = h // cfg.group_size
                M[j * e : (j + 1) * e] += p[f"{pre}.W_O"][h]
        nw = nkv * e if with_w else 0
        rows = []  # constraint rows acting on x = (c, w)
        for w, b in readers:
            wv = reader_value(p, w).reshape(d, -1)
            if w.endswith(".W_V"):
                continue
            if w.endswith(".W_K") and (absorbs(w, b) or cfg.pos != "rope"):
                continue
            if is_router(w):
                if ln is not None:
                    continue
                wv = wv - wv.mean(1, keepdim=True)
            elif absorbs(w, b):
                continue
            rows.append(torch.cat([wv.T, torch.zeros(wv.shape[1], nw, dtype=torch.float64)], 1))
        if not seg.final and closing is None:
            # total constant c + v·M must vanish (up to 1 if a LayerNorm reads next)
            tot = torch.cat([eye, M.T if with_w and M is not None else torch.zeros(d, 0, dtype=torch.float64)], 1)
            if v_reader is not None and not with_w and not absorbs(*v_reader):
                assert M is not None
                tot[:, :d] += (reader_value(p, v_reader[0]).reshape(d, -1) @ M).T
            if seg.next_ln:
                one = torch.ones(d, 1, dtype=torch.float64) / d**0.5
                tot = (eye - one @ one.T) @ tot
            rows.append(tot)
        cons = torch.cat(rows) if rows else torch.zeros(0, d + nw, dtype=torch.float64)
        basis = null_rows(cons, d + nw)
        gamma_inv = (1.0 / p[f"{ln}.w"]) if ln is not None else None
        bg = float((p[f"{ln}.b"] / p[f"{ln}.w"]).sum()) if ln is not None else None
        for x in basis:
            c, wfree = x[:d], x[d:]
            v = R.new()
            for name, _kind in seg.opening:
                R.at(v, name)[...] = c
            const = c.clone()

            def absorb(w, b, shift, v=v, gamma_inv=gamma_inv, bg=bg):
                if b is not None:
                    R.at(v, b)[...] += shift
                else:  # through the reader's weights: W + γ⁻¹⊗u adds (β·γ⁻¹)·u
                    rv = reader_rows(R, v, w)
                    rv += gamma_inv.reshape(d, *([1] * shift.dim())) * (shift / bg)

            for w, b in readers:
                rv = reader_value(p, w)
                shift = torch.einsum("d,d...->...", c, rv)
                if w.endswith(".W_V"):
                    assert M is not None  # a W_V reader: v_reader is set
                    if absorbs(w, b):
                        target = wfree.reshape(nkv, e) if with_w else torch.zeros_like(shift)
                        absorb(w, b, target - shift)
                        const = const + target.reshape(-1) @ M
                    else:
                        const = const + shift.reshape(-1) @ M
                elif w.endswith(".W_K") and b is None and cfg.pos != "rope" and ln is None:
                    continue
                elif is_router(w) and b is None and ln is None:
                    continue
                elif absorbs(w, b):
                    absorb(w, b, -shift)
            if closing is not None:
                R.at(v, closing)[...] = -const  # (all experts' b_out: the gates sum to 1)
            count += 1
        parts.append(f"{seg.label}: {basis.shape[0]}")
    if not count:
        return None
    return make_family(
        layout,
        "stream-translation",
        "Σ over stream stretches of dim{allowed (c, w)} (" + ", ".join(parts) + ")",
        count,
        R,
        translation_family.__doc__ or "",
    )
