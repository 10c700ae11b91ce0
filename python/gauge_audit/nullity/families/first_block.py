"""First-block and small-vocabulary families: when vocab < d_model (and no learned positions),
block 0 reads the stream only at the vocab points W_E[t] (through its first norm), which adds
unreached-readers, bias-trade and input-offset; tied, the unembedding sees the final norm only
on W_E's rows, which adds tied-unembed-null.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...models.layers import normalize
from ..measure import Problem
from .base import AFFINE, LN, Family, Rows, complement_of_ones, make_family
from .readers import pre_norm_readers, reader_rows, reader_value, set_reader_column, stream_map_vector


@dataclass
class _FirstPoints:
    """The finitely many points X0 at which block 0 reads the stream, their first-norm outputs Y
    and the readers of that norm."""

    X0: torch.Tensor
    Y: torch.Tensor
    norm: Callable[[torch.Tensor], torch.Tensor]  # x ↦ the first norm's output
    readers: list

    @property
    def independent(self) -> bool:
        sv = torch.linalg.svdvals(self.Y)
        return self.Y.shape[0] <= self.Y.shape[1] and float(sv[-1]) > 1e-8 * float(sv[0])

    @functools.cached_property
    def pinv(self) -> torch.Tensor:
        """Y⁺ (Y·Y⁺ = I when the points are independent): readers' outputs set at will."""
        return torch.linalg.pinv(self.Y)


def _first_points(problem: Problem) -> _FirstPoints | None:
    cfg, p = problem.cfg, problem.params()
    if cfg.attention_only or not cfg.pre_norm or "embed.W_E" not in p:
        return None
    X0 = p["embed.W_E"]
    if "embed.W_pos" in p:
        X0 = (X0[:, None, :] + p["embed.W_pos"][None, :, :]).reshape(-1, cfg.d_model)
    if X0.shape[0] > 100_000:  # far beyond the sizes a Jacobian nullity can be measured at
        return None

    def first_norm(x):
        return normalize(p, "blocks.0.ln1", cfg, x)

    return _FirstPoints(X0, first_norm(X0), first_norm, pre_norm_readers(cfg, p)["blocks.0.ln1"])


def _add_input_offset(
    problem: Problem, pts: _FirstPoints, R: Rows, v: torch.Tensor, w: torch.Tensor, values: torch.Tensor | None
) -> None:
    """Adds to v: every row of W_E moved by −w, block 0's readers re-solved so that their outputs
    on the moved points are unchanged — except W_V's, which gain the constant ``values`` (one
    per value column) on every point.  Needs independent points (Y·Y⁺ = I)."""
    from torch.func import jvp

    p, d = problem.params(), problem.cfg.d_model
    dY = jvp(pts.norm, (pts.X0,), (-w.expand_as(pts.X0),))[1]
    R.at(v, "embed.W_E")[...] -= w
    for name, _ in pts.readers:
        W = reader_value(p, name).reshape(d, -1)
        target = torch.zeros(pts.Y.shape[0], W.shape[1], dtype=torch.float64)
        if values is not None and name.endswith(".W_V"):
            target[:] = values
        rows = reader_rows(R, v, name)
        rows[...] += (pts.pinv @ (target - dY @ W)).reshape(rows.shape)


def _value_offsets(problem: Problem) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per KV group g and value coordinate e: the constant (one-hot over W_V's columns) and the
    vector w = Σ_{h∈g} W_O[h][e] it adds to block 0's output at every position."""
    cfg, p = problem.cfg, problem.params()
    out = []
    for g in range(cfg.n_kv_heads):
        for e in range(cfg.d_head):
            c = torch.zeros(cfg.n_kv_heads * cfg.d_head, dtype=torch.float64)
            c[g * cfg.d_head + e] = 1.0
            w = sum(p["blocks.0.attn.W_O"][h][e] for h in range(g * cfg.group_size, (g + 1) * cfg.group_size))
            assert isinstance(w, torch.Tensor)  # a sum over group_size ≥ 1 heads
            out.append((c, w))
    return out


def first_block_families(problem: Problem) -> list[Family]:
    """Pre-norm language models: the first block reads the stream at finitely many points.

    Without learned positions the stream entering block 0 is one of the vocab rows of W_E (with
    them, one of the vocab·n_ctx sums W_E[t] + W_pos[p]), so its first norm has a finite set Y
    of outputs.  When Y does not span R^d (vocab < d_model without learned positions; with them,
    vocab + n_ctx − 1 < d_model), families appear that no real model (vocab ≫ d) has:

    * ``unreached-readers`` — every reader of that norm (W_Q, W_K, W_V) may add any
      a ⊥ span(Y) to any column: it never sees that direction (a ⊥ 1 excluded under a
      LayerNorm without affine, where it is ln-reader-ones).

    When moreover the points of Y are linearly independent, every reader's outputs on them can
    be set at will (Y·δW = any target), and two more appear:

    * ``bias-trade`` — a reader's bias may take over a constant from its weights: b ↦ b + c,
      W ↦ W − Y⁺·1⊗c.  One per column of a biased reader (not under an affine LayerNorm, where
      ln-reader-ones is that direction: W ↦ W + γ⁻¹, b ↦ b − β·γ⁻¹).
    * ``input-offset`` — every row of W_E may move by −w if block 0 puts w back: with b_O, any
      w (b_O ↦ b_O + w; d, or d − 1 under a LayerNorm, whose ones direction is ln-writer-ones);
      without, W_V adds a constant c to every value of a KV group, which moves block 0's output
      by w = c·Σ_{h∈group} W_O[h] at every position (n_kv·d_v).  The readers re-solve
      Y'·W' = Y·W for the moved points (first order: Y·δW = target − δY·W).  Untied only (a
      tied W_E is also read by the unembedding)."""
    cfg, p, layout = problem.cfg, problem.params(), problem.layout
    d = cfg.d_model
    pts = _first_points(problem)
    if pts is None:
        return []
    Y, readers = pts.Y, pts.readers
    basis = Y if cfg.norm != "layernorm-noaffine" else torch.cat([Y, torch.ones(1, d, dtype=torch.float64)])
    _, sv, vh = torch.linalg.svd(basis, full_matrices=True)
    rank = int((sv > 1e-10 * sv[0]).sum())
    fams: list[Family] = []
    if rank < d:
        R, count = Rows(layout), 0
        for a in vh[rank:]:
            for w, _ in readers:
                for col in range(reader_value(p, w).reshape(d, -1).shape[1]):
                    v = R.new()
                    set_reader_column(R, v, w, col, a)
                    count += 1
        fams.append(
            make_family(
                layout,
                "unreached-readers",
                "(d−rank Y)·(h·d_k+n_kv·(d_k+d_v))",
                count,
                R,
                """Without learned positions block 0's first norm has finitely many outputs Y (one
                         per token); when they do not span R^d, its readers may add any a ⊥ span(Y) to any
                         column — they never see that direction.""",
            )
        )
    if not pts.independent:
        return fams
    # Y has linearly independent rows: every reader's outputs on them can be set at will (Y·Y⁺ = I)
    ones = pts.pinv.sum(1)  # Y·ones = 1: a constant on every input
    pre = "blocks.0.attn"
    R, count = Rows(layout), 0
    for w, b in readers:
        if b is None or cfg.norm == "layernorm":  # affine LayerNorm: ln-reader-ones already trades
            continue
        for col in range(reader_value(p, w).reshape(d, -1).shape[1]):
            v = R.new()
            R.at(v, b).view(-1)[col] = 1.0
            set_reader_column(R, v, w, col, -ones)
            count += 1
    if count:
        fams.append(
            make_family(
                layout,
                "bias-trade",
                "width of the biased readers",
                count,
                R,
                """The first norm's outputs Y (one per token) are linearly independent, so a
                         biased reader's bias may take over a constant from its weights: b ↦ b + c,
                         W ↦ W − Y⁺·1⊗c.""",
            )
        )
    if cfg.tied:
        return fams  # W_E is also the unembedding: see tied_unembed_family
    R, count = Rows(layout), 0
    if f"{pre}.b_O" in p:
        # b_O absorbs any offset w (along 1 under a LayerNorm it is already ln-writer-ones)
        ws = complement_of_ones(d) if cfg.norm in LN else torch.eye(d, dtype=torch.float64)
        for w in ws:
            v = R.new()
            _add_input_offset(problem, pts, R, v, w, None)
            R.at(v, f"{pre}.b_O")[...] = w
            count += 1
        formula = "d − 1" if cfg.norm in LN else "d"
    else:
        for c, w in _value_offsets(problem):
            v = R.new()
            _add_input_offset(problem, pts, R, v, w, c)
            count += 1
        formula = "n_kv·d_v"
    fams.append(
        make_family(
            layout,
            "input-offset",
            formula,
            count,
            R,
            """The first norm's outputs Y (one per token) are linearly independent: every row
                     of W_E may move by −w if block 0 puts w back — through b_O, or as a constant added
                     to a KV group's values by W_V (w = c·Σ_{h∈group} W_O[h]) — with the readers
                     re-solved for the moved points (Y·δW = target − δY·W).""",
        )
    )
    return fams


def tied_unembed_family(problem: Problem, readers: dict, writers: list[str]) -> Family | None:
    """Tied embeddings, affine final norm, vocab < d_model: the logits (n·D_γ + β)·W_Eᵀ read the
    final norm's output only on the rows of W_E, which leave a null space N = ker W_E.

    A stream rotation R = I + A (writers W·R, so W_E·R also as the unembedding) with γ ↦ γ + δγ
    changes the logits by n·M·W_Eᵀ + (δβ − β·A)·W_Eᵀ, M = A·D_γ − D_γ·A + diag(δγ) symmetric.
    So: every symmetric M with M·W_Eᵀ = 0 gives A_ij = M_ij/(γ_j − γ_i), δγ = diag M — c(c+1)/2
    of them, c = dim N (RMSNorm).  Under LayerNorm (n ⊥ 1, A·1 = 0) W_E may also move by s⊗1,
    which no norm sees: the conditions become M·W_Eᵀ + γ⊗s = 1⊗w for some w, and δβ solves
    δβ·W_Eᵀ = β·A·W_Eᵀ − (β·1)·s; β may also move along N (c more).  When block 0 reads W_E's
    rows at independent points it may also move W_E by −o and put o back (input-offset: through
    b_O, or a constant on its values); as the unembedding that adds −D_γ·o to every column of the
    first condition and β·o to δβ's.  Solved numerically as the null space of those linear
    conditions; every solution is an exact generator."""
    cfg, p, layout = problem.cfg, problem.params(), problem.layout
    d = cfg.d_model
    if not (cfg.tied and cfg.norm in AFFINE and cfg.pre_norm and "ln_final.w" in p):
        return None
    E = p["embed.W_E"]
    _, sv, vh = torch.linalg.svd(E, full_matrices=True)
    rank = int((sv > 1e-10 * sv[0]).sum())
    if rank == d:
        return None
    gamma, ln = p["ln_final.w"], cfg.norm == "layernorm"
    iu = torch.triu_indices(d, d)
    n_m, V = iu.shape[1], E.shape[0]
    # unknowns: the upper triangle of M (and w under LayerNorm); conditions: M·Eᵀ (− 1⊗w) = 0, A·1 = 0
    basis_m = torch.zeros(n_m, d, d, dtype=torch.float64)
    basis_m[torch.arange(n_m), iu[0], iu[1]] = 1.0
    basis_m[torch.arange(n_m), iu[1], iu[0]] = 1.0
    gap = gamma[None, :] - gamma[:, None]
    off = ~torch.eye(d, dtype=torch.bool)

    def skew(M):
        return torch.where(off, M / torch.where(off, gap, torch.ones_like(gap)), torch.zeros_like(M))

    cols = [
        torch.cat([(Mk @ E.T).reshape(-1), skew(Mk).sum(1) if ln else torch.zeros(0, dtype=torch.float64)])
        for Mk in basis_m
    ]
    if ln:
        # LayerNorm: W_E may also move by s⊗1 (invisible to every norm; the logits move by
        # s_t·(n·γ + β·1), which γ·sᵀ in the first condition and δβ below cancel)
        for j in range(V):  # w_j
            e = torch.zeros(d, V, dtype=torch.float64)
            e[:, j] = -1.0
            cols.append(torch.cat([e.reshape(-1), torch.zeros(d, dtype=torch.float64)]))
        for j in range(V):  # s_j
            e = torch.zeros(d, V, dtype=torch.float64)
            e[:, j] = gamma
            cols.append(torch.cat([e.reshape(-1), torch.zeros(d, dtype=torch.float64)]))
    # block 0 may move W_E by −w and put w back through its values (independent points, no b_O):
    # as an unembedding, W_E − 1⊗w moves every logit by −(n·D_γ + β)·w
    pts = _first_points(problem)
    offsets: list = []
    if pts is not None and pts.independent:
        if "blocks.0.attn.b_O" in p:  # b_O puts any w back (along 1 under LN: ln-writer-ones)
            ws = complement_of_ones(d) if cfg.norm in LN else torch.eye(d, dtype=torch.float64)
            offsets = [(None, w) for w in ws]
        else:
            offsets = _value_offsets(problem)
    for _, w in offsets:
        e = -(gamma * w)[:, None].expand(d, V)
        cols.append(torch.cat([e.reshape(-1), torch.zeros(d if ln else 0, dtype=torch.float64)]))
    C = torch.stack(cols, dim=1)
    _, cs, cvh = torch.linalg.svd(C, full_matrices=True)
    null = cvh[int((cs > 1e-10 * cs[0]).sum()) :]
    n_s = 2 * V if ln else 0
    R, count = Rows(layout), 0
    for x in null:
        M = (x[:n_m, None, None] * basis_m).sum(0)
        A = skew(M)
        v = R.new()
        stream_map_vector(problem, R, v, A, readers, writers)
        R.at(v, "ln_final.w")[...] = torch.diagonal(M)
        coef = x[n_m + n_s :]
        w_tot = sum((a * w for a, (_, w) in zip(coef, offsets)), torch.zeros(d, dtype=torch.float64))
        if offsets and offsets[0][0] is None:
            assert pts is not None  # offsets are found only at the points
            _add_input_offset(problem, pts, R, v, w_tot, None)
            R.at(v, "blocks.0.attn.b_O")[...] += w_tot
        elif offsets:
            assert pts is not None
            _add_input_offset(problem, pts, R, v, w_tot, sum(a * c for a, (c, _) in zip(coef, offsets)))
        if ln:
            beta, sv_ = p["ln_final.b"], x[n_m + V : n_m + 2 * V]
            R.at(v, "embed.W_E")[...] += sv_[:, None]
            # δβ·W_Eᵀ = β·A·W_Eᵀ − (β·1)·s + β·w  (W_E has independent rows: solvable)
            rhs = (beta @ A) @ E.T - beta.sum() * sv_ + beta @ w_tot
            R.at(v, "ln_final.b")[...] = torch.linalg.lstsq(E, rhs[:, None]).solution[:, 0]
        count += 1
    if ln:
        for z in vh[rank:]:
            v = R.new()
            R.at(v, "ln_final.b")[...] = z
            count += 1
    if count == 0:
        return None
    return make_family(
        layout,
        "tied-unembed-null",
        "null space of its conditions",
        count,
        R,
        """Tied embeddings with an affine final norm and vocab < d_model: the logits read the
                final norm only on W_E's rows, so a stream rotation A with γ_final ↦ γ_final + diag M
                (M = [A, D_γ] + diag M symmetric, M·W_Eᵀ = 0; c(c+1)/2 of them under RMSNorm, c =
                d − rank W_E) is flat, also combined with block 0's input offsets; under LayerNorm
                W_E may move by s⊗1 and β_final along ker W_E.""",
    )
