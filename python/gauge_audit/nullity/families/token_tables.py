"""Token-table families: a block-0 sublayer that reads the stream only at the vocab points.

Without learned positions the stream entering block 0 is one of the ``vocab`` rows of W_E.  Two
architectures let a whole sublayer of block 0 read only those points, so that the function depends
on that sublayer's parameters only through a finite table:

* a parallel residual (GPT-NeoX): x₁ = x₀ + Attn(n₁(x₀)) + FFN(n₂(x₀)) — W_E, n₁, n₂ and the FFN
  enter only through the tables n₁(W_E[t]) and W_E[t] + FFN(n₂(W_E[t])), t < vocab (and W_E itself
  when tied): 2·vocab·d numbers against the FFN's d·d_ff·2 parameters and W_E's vocab·d;
* no pre-norm (OLMo 2): the attention reads W_E[t] raw — its query/key side enters only through the
  score table S_h(t, s, p, p') = q_h(t, p)·k_h(s, p') (every query and key token at every pair of
  positions p' ≤ p < n_ctx), its value/output side only through U_h(t) = v(t)·W_O[h] and b_O.

Every change of those parameters that keeps the table is flat, whatever the rest of the model: the
null space of ∂table/∂θ_sub (θ_sub: the sublayer's own parameters).  It contains the sublayer's
share of the families above it (FFN scaling, norm-scale, qk-norm-scale, vo-gl, …); this family is
what is left, the part of that null space outside their span.  It exists only while the table is
small against θ_sub — vocab·d below the FFN's parameter count, or tiny vocabularies for the scores
— which no real model (vocab ≫ d) reaches: a small-vocabulary family like those of .first_block.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.func import jacfwd

from ...models.layers import ffn, full_norm, head_norm, normalize, rope
from ..measure import Problem
from .base import LN, Family, Rows, complement_of_ones, make_family, null_rows
from .readers import pre_norm_readers, pre_norm_writers, stream_map_vector
from .stream import skew_basis


def _finite_inputs(problem: Problem) -> torch.Tensor | None:
    p = problem.params()
    if "embed.W_E" not in p or "embed.W_pos" in p or problem.cfg.experts:
        return None
    E = p["embed.W_E"]
    return E if E.shape[0] <= 4096 else None  # beyond the sizes a Jacobian nullity is measured at


def _scores(cfg, sub: dict, pre: str, x: torch.Tensor) -> torch.Tensor:
    """The score table of block 0 for inputs x (vocab × d): every query token at every position
    against every key token at every earlier (or equal) position."""
    n = cfg.n_ctx
    seq = x[:, None, :].expand(x.shape[0], n, x.shape[1])  # token t repeated at every position

    def proj(name):
        y = torch.einsum("bnd,hde->bhne", seq, sub[f"{pre}.W_{name}"])
        if f"{pre}.b_{name}" in sub:
            y = y + sub[f"{pre}.b_{name}"][None, :, None, :]
        return y

    q, k = proj("Q"), proj("K")
    if cfg.qk_norm != "none":
        qk_norm = head_norm if cfg.qk_norm == "head" else full_norm
        q, k = qk_norm(sub, f"{pre}.q_norm", cfg, q), qk_norm(sub, f"{pre}.k_norm", cfg, k)
    if cfg.pos == "rope":
        q, k = rope(cfg, q), rope(cfg, k)
    k = k.repeat_interleave(cfg.group_size, dim=1)
    s = torch.einsum("thpe,shqe->htspq", q, k) / math.sqrt(cfg.d_head)
    keep = torch.ones(n, n, dtype=torch.bool).tril()  # key position q ≤ query position p
    if cfg.window:
        keep = keep & ~torch.ones(n, n, dtype=torch.bool).tril(-cfg.window)
    return s[..., keep]


def _values(cfg, sub: dict, pre: str, x: torch.Tensor) -> torch.Tensor:
    """U_h(t) = (W_E[t]·W_V[j] + b_V[j])·W_O[h] for every head, and b_O."""
    v = torch.einsum("td,jde->jte", x, sub[f"{pre}.W_V"])
    if f"{pre}.b_V" in sub:
        v = v + sub[f"{pre}.b_V"][:, None, :]
    v = v.repeat_interleave(cfg.group_size, dim=0)
    u = torch.einsum("hte,hed->htd", v, sub[f"{pre}.W_O"]).reshape(-1)
    return torch.cat([u, sub[f"{pre}.b_O"]]) if f"{pre}.b_O" in sub else u


def _tables(problem: Problem) -> list[tuple[str, list[str], Callable[[dict], torch.Tensor]]]:
    """(what, parameter names, table function of those parameters) for every block-0 sublayer
    that reads only the vocab points."""
    cfg, p = problem.cfg, problem.params()
    x = _finite_inputs(problem)
    if x is None or cfg.attention_only:
        return []
    out = []
    if cfg.pre_norm and cfg.parallel_residual:
        # what the rest of the model sees of W_E, n₁, n₂, the FFN and the attention's readers in
        # block 0: the per-token projections n₁(W_E[t])·W_{Q,K,V} + b (RoPE and the softmax come
        # after), the stream W_E[t] + FFN(n₂(W_E[t])) without the attention's output, and W_E
        # itself when it is also the unembedding (then W_E is held fixed: its moves as the
        # unembedding are outside this table)
        pre = "blocks.0.attn"
        readers = [f"{pre}.{n}" for n in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V") if f"{pre}.{n}" in p]
        names = (
            ([] if cfg.tied else ["embed.W_E"])
            + readers
            + [n for n in p if n.startswith(("blocks.0.ln1.", "blocks.0.ln2.", "blocks.0.mlp."))]
        )

        def parallel(sub):
            E = sub.get("embed.W_E", p["embed.W_E"])
            y = normalize(sub, "blocks.0.ln1", cfg, E)
            proj = []
            for n in "QKV":
                t = torch.einsum("td,hde->hte", y, sub[f"{pre}.W_{n}"])
                if f"{pre}.b_{n}" in sub:
                    t = t + sub[f"{pre}.b_{n}"][:, None, :]
                proj.append(t)
            stream = E + ffn(sub, "blocks.0", cfg, normalize(sub, "blocks.0.ln2", cfg, E), None)
            parts = [*proj, stream]
            return torch.cat([t.reshape(-1) for t in parts])

        out.append(("FFN", names, parallel))
    if cfg.normed_outputs and not cfg.normed_inputs:
        pre = "blocks.0.attn"
        qk = [f"{pre}.{n}" for n in ("W_Q", "b_Q", "W_K", "b_K", "q_norm", "k_norm") if f"{pre}.{n}" in p]
        vo = [f"{pre}.{n}" for n in ("W_V", "b_V", "W_O", "b_O") if f"{pre}.{n}" in p]
        out.append(("scores", qk, lambda sub: _scores(cfg, sub, pre, x)))
        out.append(("values", vo, lambda sub: _values(cfg, sub, pre, x)))
    return out


def _null_of_table(problem: Problem, names: list[str], fn: Callable[[dict], torch.Tensor]) -> torch.Tensor:
    """Rows: an orthonormal basis (in the full layout) of the null space of ∂table/∂θ_sub."""
    p, layout = problem.params(), problem.layout
    sub = {n: p[n] for n in names}
    # forward mode: θ_sub has hundreds of entries, the score table up to vocab²·n_ctx²·heads rows
    jac = jacfwd(lambda s: fn(s).reshape(-1))(sub)
    J = torch.cat([jac[n].reshape(jac[n].shape[0], -1) for n in names], dim=1)
    # all θ_sub right singular vectors, without the rows × rows factor (J is often far taller than wide)
    _, s, vh = torch.linalg.svd(J, full_matrices=J.shape[0] < J.shape[1])
    # exact null directions sit at ~1e-15·σ_max; the ε-broken ones (a norm's scale at ε > 0) at
    # ≳ ε·1e-4·σ_max (3e-10 at ε = 1e-6): 1e-12 separates them with two decades either side
    rank = int((s > s[0] * 1e-12).sum()) if s.numel() else 0
    null = vh[rank:]
    out = torch.zeros(null.shape[0], layout.size, dtype=torch.float64)
    col = 0
    for n in names:
        k = p[n].numel()
        out[:, layout.span(n)] = null[:, col : col + k]
        col += k
    return out


def _outside(vectors: torch.Tensor, others: list[torch.Tensor]) -> torch.Tensor:
    """Rows spanning a complement of span(others) ∩ span(vectors) in span(vectors): combinations
    of the vectors, so exact wherever they are (orthonormal when the vectors are).  Principal
    angles against the others' span: sin θ > 1e-6 counts as new."""
    if vectors.shape[0] == 0:
        return vectors
    stack = [o for o in others if o.shape[0]]
    if stack:
        O = torch.cat(stack)
        sup = (O != 0).any(0) | (vectors != 0).any(0)  # generators are sparse: work on their columns
        # an orthonormal basis of the others' span from the SVD of their normalised rows (a QR
        # without pivoting misjudges the rank of generators that are far from orthogonal)
        On = O[:, sup] / torch.linalg.vector_norm(O[:, sup], dim=1, keepdim=True).clamp_min(1e-300)
        _, so, vo = torch.linalg.svd(On, full_matrices=False)
        q = vo[so > 1e-9 * so[0]].T
        res = vectors[:, sup] - (vectors[:, sup] @ q) @ q.T
    else:
        sup = (vectors != 0).any(0)
        res = vectors[:, sup]
    # left singular vectors of res from its Gram (k × k: the dense SVD of the wide res may fail
    # to converge); σ > 1e-6 is σ² > 1e-12, far above the Gram's rounding (~ε·‖res‖²)
    lam, u = torch.linalg.eigh(res @ res.T)
    # the new directions as combinations of the given vectors (orthonormal coefficients U), not
    # as the residuals themselves: those carry the projection's rounding on the others' span,
    # amplified by 1/σ where the others' generators are far from orthogonal (wide readers)
    return u[:, lam > 1e-12].T @ vectors


def token_table_families(problem: Problem, above: list[Family]) -> list[Family]:
    """One family per block-0 table; ``above``: the families already built (their exact members
    are what the null space is reduced against)."""
    exact = [f.vectors for f in above if f.kind != "eps-broken"]
    out = []
    for what, names, fn in _tables(problem):
        new = _outside(_null_of_table(problem, names, fn), exact)
        if new.shape[0] == 0:
            continue
        R = Rows(problem.layout)
        R.rows = list(new)
        fam = make_family(
            problem.layout,
            f"token-table-{what.lower()}",
            f"null(∂{what} table/∂θ) − the families above",
            new.shape[0],
            R,
            f"""Block 0's {what} reads the stream only at the vocab rows of W_E, so the function
                depends on its parameters only through a finite table; every change that keeps the
                table is flat.  Counted: the null space of the table's Jacobian outside the span of
                the families above (a small-vocabulary family: absent when vocab ≫ d).""",
        )
        exact.append(fam.vectors)
        out.append(fam)
    tied = tied_table_family(problem, [*above, *out])
    return [*out, tied] if tied is not None else out


def _rotation_basis(cfg) -> list[torch.Tensor]:
    """The stream rotations every later norm admits: so(1^⊥) under a LayerNorm, so(d) else."""
    d = cfg.d_model
    return skew_basis(complement_of_ones(d).T if cfg.norm in LN else torch.eye(d, dtype=torch.float64))


def tied_table_dimension(d: int, vocab: int) -> int:
    """The dimension of tied-table-rotation (affine final norm, d < vocab) when block 0's FFN can
    set its stream table at will (∂T/∂θ_FFN onto R^{vocab·d}), under an affine LayerNorm.

    The stream table then follows any δW_E, so only the unembedding and n₁ constrain it.  The
    unembedding (W_Eᵀ has full row rank d) asks δW_E = W_E·A with
    A = D_γ·B·D_γ⁻¹ − D_{δγ/γ} + u⊗γ⁻¹: B in so(1^⊥) ((d−1)(d−2)/2), δγ (d) and u (d: the
    ones direction the centring P leaves free, 1·P = 0); δβ =
    −β·Aᵀ then always exists.  n₁ asks that the first-order change of n(W_E[t]) be affine in
    n(W_E[t]) (block 0's readers and n₁ absorb an affine change, nothing else): with
    x_t = μ_t·1 + s_t·n_t, J_n(x_t)[x_t·A] = (μ_t/s_t)·(1·A·P − ⋯) + n_t·A·P − n_t·(n_t·A·n_tᵀ)/d,
    affine on the vocab points where 1·A·P = 0 (d − 1 conditions) and n_t·A·n_tᵀ is the same for
    every token (vocab − 1).  That is also the most it can cost: an affine function of n_t is
    (d−1)·d numbers against the table's (d−1)·vocab, so the conditions number min((d−1)·(vocab−d), (d−1) + (vocab−1)) — the first
    just above d (vocab = d + 1: d − 1 conditions), the second from vocab ≥ d + 2 on.  Gone once
    vocab ≥ (d−1)(d−2)/2 + d + 2: a small-vocabulary family."""
    if vocab <= d:
        raise ValueError("tied_table_dimension: the formula holds for vocab > d_model")
    free = (d - 1) * (d - 2) // 2 + 2 * d
    return max(0, free - min((d - 1) * (vocab - d), (d - 1) + (vocab - 1)))


def tied_table_family(problem: Problem, above: list[Family]) -> Family | None:
    """Tied embeddings and a parallel block 0 (see :func:`token_table_families`): W_E may move as
    δW_E if block 0's table puts the stream back rotated and the unembedding takes the move.

    The rest of the model sees W_E twice: through block 0's table (the projections n₁(W_E[t])·W
    + b and the stream W_E[t] + FFN(n₂(W_E[t]))) and as the unembedding, logits = (n·D_γ + β)·W_Eᵀ
    with n = n_f(x_L).  Take a stream rotation generator B (B·1 = 0 under a LayerNorm), applied
    from block 0's attention output on (writers W·B, later readers and norms by the stream-map
    rule), and δγ, δβ on the final norm.  The logits stay iff, for every n the final norm can
    output (n ⊥ 1 under a LayerNorm: P the centring, else P = I),

        P·[(B·D_γ + D_δγ)·W_Eᵀ + D_γ·δW_Eᵀ] = 0   and   δβ·W_Eᵀ + β·δW_Eᵀ = 0,

    and the rest of block 0 stays iff its table moves by exactly the rotation of its stream:
    ∂table/∂θ₀·δθ₀ + ∂table/∂W_E·δW_E = (0 on the projections, T·B on the stream T), θ₀ the
    table's own parameters (block 0's readers, n₁, n₂, the FFN).  Every solution of these linear
    conditions is an exact generator.  Untied, W_E's two roles are separate parameters (the
    stream rotation and token-table-ffn hold them); tied, B must reconcile them and the
    stream-rotation family is absent, so this one is what is left of it.

    Counted: the solutions outside the span of the families above; where block 0's FFN can set
    its stream table at will, :func:`tied_table_dimension` predicts that count."""
    cfg, p, layout = problem.cfg, problem.params(), problem.layout
    if not (cfg.tied and cfg.parallel_residual and cfg.pre_norm and cfg.norm != "none"):
        return None
    tables = [t for t in _tables(problem) if t[0] == "FFN"]
    if not tables:
        return None
    _, names, fn = tables[0]
    E = p["embed.W_E"]
    V, d = E.shape
    sub = {n: p[n] for n in names} | {"embed.W_E": E}
    jac = jacfwd(lambda s: fn(s).reshape(-1))(sub)
    J_sub = torch.cat([jac[n].reshape(jac[n].shape[0], -1) for n in names], dim=1)
    J_E = jac["embed.W_E"].reshape(-1, V * d)
    T = fn(sub)[-V * d :].reshape(V, d)  # the stream table
    rows = J_sub.shape[0]
    gens = _rotation_basis(cfg)
    gamma = p.get("ln_final.w", torch.ones(d, dtype=torch.float64))
    beta = p.get("ln_final.b")
    P = torch.eye(d, dtype=torch.float64) - 1.0 / d if cfg.norm in LN else torch.eye(d, dtype=torch.float64)
    n_sub, n_e, n_b = J_sub.shape[1], V * d, len(gens)
    n_g = d if "ln_final.w" in p else 0
    n_beta = d if beta is not None else 0
    # unknowns: δθ₀ | δW_E | B's coefficients | δγ | δβ
    table = torch.zeros(rows, n_sub + n_e + n_b + n_g + n_beta, dtype=torch.float64)
    table[:, :n_sub], table[:, n_sub : n_sub + n_e] = J_sub, J_E
    for k, b in enumerate(gens):
        table[rows - V * d :, n_sub + n_e + k] = -(T @ b).reshape(-1)
    unemb = torch.zeros(d * V + (V if beta is not None else 0), table.shape[1], dtype=torch.float64)
    eye_e = torch.eye(n_e, dtype=torch.float64).reshape(n_e, V, d)
    # P·D_γ·δW_Eᵀ, column by column of δW_E
    unemb[: d * V, n_sub : n_sub + n_e] = (P @ (gamma[:, None] * eye_e.transpose(1, 2))).reshape(n_e, -1).T
    for k, b in enumerate(gens):
        unemb[: d * V, n_sub + n_e + k] = (P @ b @ torch.diag(gamma) @ E.T).reshape(-1)
    for i in range(n_g):
        unemb[: d * V, n_sub + n_e + n_b + i] = (P[:, i : i + 1] @ E[:, i : i + 1].T).reshape(-1)
    if beta is not None:
        unemb[d * V :, n_sub : n_sub + n_e] = (eye_e @ beta).T  # β·δW_Eᵀ
        unemb[d * V :, n_sub + n_e + n_b + n_g :] = E  # δβ·W_Eᵀ
    # the two blocks of conditions in comparable units (the null space does not depend on it)
    C = torch.cat([table / torch.linalg.matrix_norm(table), unemb / torch.linalg.matrix_norm(unemb)])
    null = null_rows(C, C.shape[1])
    if null.shape[0] == 0:
        return None
    readers = {
        n: rs for n, rs in pre_norm_readers(cfg, p).items() if n not in ("blocks.0.ln1", "blocks.0.ln2", "ln_final")
    }
    writers = [
        w for w in pre_norm_writers(cfg, p) if w not in ("embed.W_E", "blocks.0.mlp.W_out", "blocks.0.mlp.b_out")
    ]
    R = Rows(layout)
    for z in null:
        v = R.new()
        B = sum(
            (c * b for c, b in zip(z[n_sub + n_e : n_sub + n_e + n_b], gens)), torch.zeros(d, d, dtype=torch.float64)
        )
        stream_map_vector(problem, R, v, B, readers, writers)
        col = 0
        for n in names:
            k = p[n].numel()
            R.at(v, n).view(-1)[...] += z[col : col + k]
            col += k
        R.at(v, "embed.W_E").view(-1)[...] += z[n_sub : n_sub + n_e]
        if n_g:
            R.at(v, "ln_final.w")[...] = z[n_sub + n_e + n_b : n_sub + n_e + n_b + n_g]
        if n_beta:
            R.at(v, "ln_final.b")[...] = z[n_sub + n_e + n_b + n_g :]
    new = _outside(R.matrix(), [f.vectors for f in above if f.kind != "eps-broken"])
    if new.shape[0] == 0:
        return None
    out = Rows(layout)
    out.rows = list(new)
    # the FFN (with n₂) sets its stream table at will: the formula's regime
    ffn = [i for i, n in enumerate(names) if n.startswith(("blocks.0.ln2.", "blocks.0.mlp."))]
    cols = torch.cat([jac[names[i]].reshape(rows, -1)[rows - V * d :] for i in ffn], dim=1)
    sv = torch.linalg.svdvals(cols)
    onto = cfg.norm == "layernorm" and V > d and int((sv > 1e-10 * sv[0]).sum()) == V * d
    if onto:
        formula, expected = "(d−1)(d−2)/2 + 2d − min((d−1)(V−d), d+V−2)", tied_table_dimension(d, V)
    else:
        formula, expected = "null of its conditions − the families above", new.shape[0]
    return make_family(
        layout,
        "tied-table-rotation",
        formula,
        expected,
        out,
        """Tied embeddings and a parallel block 0: W_E may move if block 0's table (the
            projections of n₁(W_E[t]) and the stream W_E[t] + FFN(n₂(W_E[t]))) re-solves to the
            same projections and a rotated stream T·B, and the unembedding takes the move with the
            final norm (P·[(B·D_γ + D_δγ)·W_Eᵀ + D_γ·δW_Eᵀ] = 0, δβ·W_Eᵀ + β·δW_Eᵀ = 0): the
            stream rotation that the tied final norm otherwise forbids (a small-vocabulary family).""",
    )
