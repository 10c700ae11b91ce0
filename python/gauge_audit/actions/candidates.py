"""Candidate gauge families of a derived description: generators in parameter space and the
finite group elements they generate.

Each continuous family is a Lie algebra given by a spanning set of tangent vectors (one dict of
tensors per generator, in transformers' own tensor layout) and its group's action: coefficients
c (one per generator) ↦ the parameters moved by exp(Σ c_j ξ_j), whose derivative at c = 0 along
c_j is generator j.  The measurement keeps the subalgebra that is flat on the model's own
forward; a finite element of it is then drawn, applied and checked like any other action.  A family may therefore be stated *larger*
than the symmetry it hides — GL(d_k) on the queries and keys of a KV group, every scaling of
every hidden coordinate of an FFN, gl(d_model) on the stream — and what survives RoPE, a
QK-norm, an output gate or a clamped GLU is measured, not assumed.

Each discrete candidate is a map on the parameters, tested by the forward.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..models.derived import Description, Heads, Hidden, Latent, LatentHeads, Norm, Opaque, Reader
from ..runtime import above_rounding, matrix_exp

Tangent = dict[str, torch.Tensor]
Params = dict[str, torch.Tensor]


@dataclass
class Family:
    name: str
    scope: str  # the layer or slot it acts on
    generators: list[Tangent]
    what: str  # the candidate group, as stated
    act: Callable[[Params, torch.Tensor], Params]  # coefficients (one per generator) → moved parameters
    kappa: Callable[[torch.Tensor], float]  # the element's condition number at those coefficients
    # where the element can be read off two parameter sets: ("gl", e, tensor, axis, offsets) — that
    # tensor's blocks map X ↦ exp(C)ᵀ·X; ("coord", entries per generator)
    spec: tuple | None = None
    # a GL family's element given as its matrix F (exp(C) for coefficients C; also F outside exp's image)
    by_matrix: Callable[[Params, torch.Tensor], Params] | None = None
    # a family that names its own representative: params ↦ the coefficients that take them there
    # (a closed form the canonical form uses instead of a search)
    canonical: Callable[[Params], torch.Tensor] | None = None
    # its element is read off the point it acts at without derivatives (a null space): a chain of
    # elements differentiated by torch.func applies it first, at the chain's own start, where that
    # point is a constant — its derivatives are then exact
    read_off: bool = False


@dataclass
class Discrete:
    name: str
    scope: str
    apply: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    what: str
    # the permutation group this swap generates: (params, π) ↦ item i takes old item π[i]; π of
    # shape (items,), or (experts, items) for units permuted in each expert on its own
    permute: Callable[[Params, torch.Tensor], Params] | None = None
    items: int = 0  # what π permutes; for a rotary turn: the planes
    # a rotary turn of any plane: (params, plane, KV group, quarter turns) ↦ params
    turn: Callable[..., Params] | None = None


def _zero_like(params, name) -> torch.Tensor:
    return torch.zeros_like(params[name])


def _factor(norm: Norm, params) -> torch.Tensor:
    g = norm.gamma(params)
    assert g is not None
    return g


# ----------------------------------------------------------------------------- the three kinds of action
def _on_axis(t: torch.Tensor, axis: int, M: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """``t`` with the block [offset, offset + len(M)) of ``axis`` mapped X ↦ M·X (X that block,
    moved to the front)."""
    e = M.shape[0]
    x = t.movedim(axis, 0)
    blk = x[offset : offset + e]
    # out of place, so that forward- and reverse-mode derivatives both pass through
    x = torch.cat([x[:offset], (M @ blk.reshape(e, -1)).reshape(blk.shape), x[offset + e :]])
    return x.movedim(0, axis)


def _cond(*Ms: torch.Tensor) -> float:
    return max(float(torch.linalg.cond(M)) for M in Ms)


Side = tuple[str | None, int, list[int], bool]  # tensor, axis, offsets of its copies of the space, forward


def _gl(name: str, scope: str, params, e: int, sides: list[Side]) -> Family:
    """GL(e) on one coordinate space that several tensors hold.  Generator E_ab: a forward side
    takes x ↦ x·(I + tE_ab) (slot b gains slot a), another side the inverse transpose's tangent
    (slot a loses slot b); the element of coefficients C (C_ab of E_ab) maps a forward side's
    block X ↦ exp(C)ᵀ·X and the others' X ↦ exp(−C)·X, so the two cancel in every product."""
    gens = []
    for a in range(e):
        for b in range(e):
            t: Tangent = {}
            for tensor, axis, offsets, forward in sides:
                if tensor is None:
                    continue
                z = t.setdefault(tensor, _zero_like(params, tensor))
                for o in offsets:
                    if forward:
                        z.select(axis, o + b).add_(params[tensor].select(axis, o + a))
                    else:
                        z.select(axis, o + a).sub_(params[tensor].select(axis, o + b))
            gens.append(t)

    def mats(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        C = c.reshape(e, e).to(torch.float64)
        return matrix_exp(C.T), matrix_exp(-C)

    def by_matrix(p: Params, F: torch.Tensor) -> Params:
        """The element F itself (any invertible F, exp(C) or not): X ↦ Fᵀ·X and X ↦ F⁻¹·X."""
        fwd, inv = F.T, torch.linalg.inv(F)
        p = dict(p)
        for tensor, axis, offsets, forward in sides:
            if tensor is not None:
                for o in offsets:
                    p[tensor] = _on_axis(p[tensor], axis, fwd if forward else inv, o)
        return p

    def act(p: Params, c: torch.Tensor) -> Params:
        fwd, inv = mats(c)
        p = dict(p)
        for tensor, axis, offsets, forward in sides:
            if tensor is not None:
                for o in offsets:
                    p[tensor] = _on_axis(p[tensor], axis, fwd if forward else inv, o)
        return p

    fwd = next(x for x in sides if x[3] and x[0] is not None)
    spec = ("gl", e, fwd[0], fwd[1], fwd[2])
    return Family(name, scope, gens, f"GL({e})", act, lambda c: _cond(*mats(c)), spec, by_matrix)


Entry = tuple[str, tuple, float, str]  # tensor, index, sign, kind: scale | scale1p | shift


def _coordinatewise(name: str, scope: str, params, gens: list[list[Entry]], what: str = "") -> Family:
    """Scalings and shifts of single coordinates: generator j moves the entries it lists at rate
    sign·c_j — ``scale`` x ↦ x·(1 + t), ``scale1p`` a ``1+w`` norm's factor (1 + w)·(1 + t),
    ``shift`` x ↦ x + t.  The element of coefficients c is the flow of Σ c_j ξ_j for unit time:
    with A the summed scale rate and B the summed shift rate of an entry (a ``1+w`` factor
    scales at rate a and shifts at rate a), x ↦ x·e^A + B·(e^A − 1)/A — a unit's pre-activation
    and its bias scaled about a fixed point (gpt-oss's up branch u + 1) is one flow."""

    # per tensor: the flat positions each generator moves, its id and sign, for the scale and shift rates
    where: dict[str, dict[str, list]] = {}
    for j, entries in enumerate(gens):
        for tensor, idx, sign, kind in entries:
            pos = torch.arange(params[tensor].numel()).reshape(params[tensor].shape)[idx].reshape(-1)
            w = where.setdefault(tensor, {"sp": [], "sj": [], "ss": [], "hp": [], "hj": [], "hs": []})
            for key, on in (("s", kind != "shift"), ("h", kind != "scale")):
                if on:
                    w[key + "p"].append(pos)
                    w[key + "j"].append(torch.full_like(pos, j))
                    w[key + "s"].append(torch.full(pos.shape, sign, dtype=torch.float64))
    index = {
        t: {k: torch.cat(v) if v else torch.zeros(0, dtype=torch.long) for k, v in w.items()} for t, w in where.items()
    }

    def rates(c: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per tensor the scale rate A and the shift rate B of every entry (index_add: no in-place
        write of c's entries, so forward-mode derivatives pass through)."""
        out = {}
        for t, ix in index.items():
            n = params[t].numel()
            z = c.new_zeros(n)
            A = z.index_add(0, ix["sp"], ix["ss"].to(c.dtype) * c[ix["sj"]]) if ix["sp"].numel() else z
            B = z.index_add(0, ix["hp"], ix["hs"].to(c.dtype) * c[ix["hj"]]) if ix["hp"].numel() else z
            out[t] = (A.reshape(params[t].shape), B.reshape(params[t].shape))
        return out

    tangents: list[Tangent] = []
    for j in range(len(gens)):
        unit = torch.zeros(len(gens), dtype=torch.float64)
        unit[j] = 1.0
        tangents.append({t: A * params[t] + B for t, (A, B) in rates(unit).items() if bool(A.any()) or bool(B.any())})

    def act(p: Params, c: torch.Tensor) -> Params:
        p = dict(p)
        for tensor, (A, B) in rates(c).items():
            small = A.abs() < 1e-8  # (e^A − 1)/A by its series there
            ratio = torch.where(small, 1.0 + A / 2, torch.expm1(A) / torch.where(small, 1.0, A))
            p[tensor] = p[tensor] * torch.exp(A) + B * ratio
        return p

    def kappa(c: torch.Tensor) -> float:
        logs = [0.0]
        for A, _ in rates(c.detach()).values():
            logs += [float(A.max()), float(A.min())]
        return math.exp(max(logs) - min(logs))

    return Family(name, scope, tangents, what or f"(R^×)^{len(gens)}", act, kappa, ("coord", gens))


def _index(t: torch.Tensor, axis: int, j: int, expert: int | None = None) -> tuple:
    idx: list = [slice(None)] * t.dim()
    if expert is not None:
        idx[0] = expert
    idx[axis] = j
    return tuple(idx)


# ----------------------------------------------------------------------------- heads
def _q_rows(h: Heads, head: int, i: int) -> int:
    return h.q_starts[head] + i


def qk_gl(h: Heads, params) -> list[Family]:
    """Per KV group: q ↦ q·M on its query heads, k ↦ k·M⁻ᵀ, M ∈ GL(d_k) (generators E_ab)."""
    e, out = h.head_dim, []
    for g in range(h.n_kv):
        q_rows = [_q_rows(h, head, 0) for head in range(g * h.group, (g + 1) * h.group)]
        k_rows = [h.k_starts[g]]
        sides = [(h.q, 0, q_rows, True), (h.qb, 0, q_rows, True), (h.k, 0, k_rows, False), (h.kb, 0, k_rows, False)]
        out.append(_gl("qk-gl", f"layer {h.layer} KV group {g}", params, e, sides))
    return out


def vo_gl(h: Heads, params) -> list[Family]:
    """Per KV group: v ↦ v·N, and every query head of the group's o_proj columns ↦ N⁻¹·(…)."""
    e, out = h.head_dim, []
    for g in range(h.n_kv):
        o_cols = [head * e for head in range(g * h.group, (g + 1) * h.group)]
        v_rows = [h.v_starts[g]]
        sides = [(h.v, 0, v_rows, True), (h.vb, 0, v_rows, True), (h.o, 1, o_cols, False)]
        out.append(_gl("vo-gl", f"layer {h.layer} KV group {g}", params, e, sides))
    return out


def _norm_entry(n: Norm, c: int, sign: float = 1.0) -> Entry:
    assert n.weight is not None
    return (n.weight, (c,), sign, "scale1p" if n.kind == "rms1p" else "scale")


def qk_norm_scale(h: Heads, params) -> list[Family]:
    """Every coordinate of the query and key norms' weights scaled on its own."""
    gens = [
        [_norm_entry(n, c)]
        for n in (h.q_norm, h.k_norm)
        if n is not None and n.weight
        for c in range(params[n.weight].numel())
    ]
    return [_coordinatewise("qk-norm-scale", f"layer {h.layer}", params, gens)] if gens else []


# ----------------------------------------------------------------------------- hidden spaces
def hidden_scale(hd: Hidden, params) -> list[Family]:
    """Every hidden coordinate of every reader (its weight's row with its bias entry: the unit's
    pre-activation), of every reader bias alone (a shift) and of the writer, scaled on its own
    (per expert)."""
    axes = dict(hd.readers)
    biases = {w: (b, axes[b]) for b, w in hd.biases}  # a weight → its bias and the bias's unit axis
    gens: list[list[Entry]] = []
    for e in range(hd.experts) if hd.experts else [None]:
        for name, axis in hd.readers + hd.writers:
            if name in dict(hd.biases):
                continue
            for j in range(params[name].shape[axis]):
                entries: list[Entry] = [(name, _index(params[name], axis, j, e), 1.0, "scale")]
                if name in biases:
                    b, ba = biases[name]
                    entries.append((b, _index(params[b], ba, j, e), 1.0, "scale"))
                    gens.append([(b, _index(params[b], ba, j, e), 1.0, "shift")])
                gens.append(entries)
    return [_coordinatewise("ffn-scale", hd.name, params, gens)]


def router_shift(hd: Hidden, params, d: int) -> list[Family]:
    """One vector added to every expert's router row (and one constant to every router bias)."""
    if not hd.router:
        return []
    gens: list[list[Entry]] = [[(hd.router, (slice(None), j), 1.0, "shift")] for j in range(d)]
    if hd.router_bias:
        gens.append([(hd.router_bias, (slice(None),), 1.0, "shift")])
    return [_coordinatewise("router-shift", hd.name, params, gens, f"R^{len(gens)}")]


# ----------------------------------------------------------------------------- the stream
def _slice(t: torch.Tensor, axis: int, c: int) -> torch.Tensor:
    return t.select(axis, c)


def stream_gl(desc: Description, params) -> list[Family]:
    """x ↦ x·(I + tA) on the stream, A ∈ gl(d): writers' outputs follow, each reader behind a norm
    with factor Γ takes −Γ⁻¹AΓ on its input (a norm's shift β: β·Γ⁻¹AΓ), post-norm factors can
    follow only a diagonal A.  The element of coefficients C: writers X ↦ exp(C)ᵀX, readers
    X ↦ Γ⁻¹exp(−C)Γ·X, shifts β ↦ (Γ⁻¹exp(C)Γ)ᵀβ, post-norm factors γ ↦ γ·exp(diag C)."""
    if not desc.stream_described:
        return []
    d = desc.d_model
    gammas = {r.norm.module: r.norm.gamma(params) for r in desc.readers if r.norm is not None}
    gens = []
    for a in range(d):
        for b in range(d):
            t: Tangent = {}

            def add(name: str, value: torch.Tensor, axis: int, at: int, t: Tangent = t) -> None:
                z = t.setdefault(name, _zero_like(params, name))
                z.select(axis, at).add_(value)

            for w in desc.writers:
                add(w.param, _slice(params[w.param], w.axis, a), w.axis, b)
                if w.bias:  # the stream is a bias's last axis (an expert's bias: E × d)
                    add(w.bias, params[w.bias].select(-1, a), -1, b)
            for pn in desc.post_norms:
                if a == b and pn.weight:
                    add(pn.weight, _factor(pn, params)[a], 0, a)
                    if pn.bias:
                        add(pn.bias, params[pn.bias][a], 0, a)
            shifted: set[str] = set()
            for r in desc.readers:
                g = gammas.get(r.norm.module) if r.norm is not None else None
                ratio = 1.0 if g is None else float(g[b] / g[a])
                add(r.param, -ratio * _slice(params[r.param], r.axis, b), r.axis, a)
                if r.norm is not None and r.norm.bias and r.norm.bias not in shifted:
                    shifted.add(r.norm.bias)
                    add(r.norm.bias, ratio * params[r.norm.bias][a], 0, b)
            gens.append(t)

    def conj(C: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        M = matrix_exp(C)
        return M if g is None else (M * g[None, :]) / g[:, None]  # Γ⁻¹·exp(C)·Γ

    def act(p: Params, c: torch.Tensor) -> Params:
        C = c.reshape(d, d).to(torch.float64)
        fwd = matrix_exp(C.T)
        out = dict(p)
        for w in desc.writers:
            out[w.param] = _on_axis(out[w.param], w.axis, fwd)
            if w.bias:
                out[w.bias] = _on_axis(out[w.bias], out[w.bias].dim() - 1, fwd)
        scale = torch.exp(torch.diagonal(C))
        for pn in desc.post_norms:
            if pn.weight:
                f = _factor(pn, p) * scale
                out[pn.weight] = f - 1.0 if pn.kind == "rms1p" else f
                if pn.bias:
                    out[pn.bias] = p[pn.bias] * scale
        shifted: set[str] = set()
        for r in desc.readers:  # Γ at p: after a norm fold the same rotation reads the new factors
            g = r.norm.gamma(p) if r.norm is not None else None
            out[r.param] = _on_axis(out[r.param], r.axis, conj(-C, g))
            if r.norm is not None and r.norm.bias and r.norm.bias not in shifted:
                shifted.add(r.norm.bias)
                out[r.norm.bias] = conj(C, g).T @ p[r.norm.bias]
        return out

    def kappa(c: torch.Tensor) -> float:
        C = c.reshape(d, d).to(torch.float64)
        return _cond(matrix_exp(C), *(conj(-C, g) for g in gammas.values() if g is not None))

    embed = desc.writers[0]  # the embedding: nothing but the stream moves it
    return [Family("stream-gl", "stream", gens, f"GL({d})", act, kappa, ("gl", d, embed.param, embed.axis, [0]))]


def norm_fold(desc: Description, params) -> list[Family]:
    """Each coordinate of a norm's factor scaled, its readers' inputs scaled back (the stream's
    norms and the latents')."""
    by_norm: dict[str, list] = {}
    norms: dict[str, Norm] = {}
    for r in desc.readers + desc.latent_readers:
        if r.norm is not None and r.norm.weight:
            by_norm.setdefault(r.norm.module, []).append(r)
            norms[r.norm.module] = r.norm
    out = []
    for mod, readers in by_norm.items():
        n = norms[mod]
        gens: list[list[Entry]] = []
        for c in range(_factor(n, params).numel()):
            entries = [_norm_entry(n, c)] + ([(n.bias, (c,), 1.0, "scale")] if n.bias else [])
            entries += [(r.param, _index(params[r.param], r.axis, c), -1.0, "scale") for r in readers]
            gens.append(entries)
        out.append(_coordinatewise("norm-fold", mod, params, gens))
    return out


def latent_gl(lt: Latent, params) -> list[Family]:
    """y ↦ y·(I + tA) on a latent, A ∈ gl(rank): its rows of the down-projection (and bias)
    follow, its readers behind the RMSNorm with factor Γ take −Γ⁻¹AΓ on their input columns — the
    stream's rule on a stream of its own (flat where A is skew: the norm keeps only rotations).
    The element F: the latent's rows X ↦ Fᵀ·X, the readers' columns X ↦ Γ⁻¹F⁻¹Γ·X."""
    r, g0 = lt.rank, _factor(lt.norm, params)
    gens = []
    for a in range(r):
        for b in range(r):
            t: Tangent = {}
            for w in (lt.down, lt.down_bias):
                if w:
                    t.setdefault(w, _zero_like(params, w)).select(0, lt.start + b).add_(
                        params[w].select(0, lt.start + a)
                    )
            for rd in lt.readers:
                z = t.setdefault(rd, _zero_like(params, rd))
                z.select(1, a).sub_(float(g0[b] / g0[a]) * params[rd].select(1, b))
            gens.append(t)

    def by_matrix(p: Params, F: torch.Tensor) -> Params:
        g = _factor(lt.norm, p)
        out = dict(p)
        for w in (lt.down, lt.down_bias):
            if w:
                out[w] = _on_axis(out[w], 0, F.T, lt.start)
        back = (torch.linalg.inv(F) * g[None, :]) / g[:, None]  # Γ⁻¹·F⁻¹·Γ
        for rd in lt.readers:
            out[rd] = _on_axis(out[rd], 1, back)
        return out

    def act(p: Params, c: torch.Tensor) -> Params:
        C = c.reshape(r, r).to(torch.float64)
        g = _factor(lt.norm, p)
        out = dict(p)
        for w in (lt.down, lt.down_bias):
            if w:
                out[w] = _on_axis(out[w], 0, matrix_exp(C.T), lt.start)
        back = (matrix_exp(-C) * g[None, :]) / g[:, None]
        for rd in lt.readers:
            out[rd] = _on_axis(out[rd], 1, back)
        return out

    def kappa(c: torch.Tensor) -> float:
        C = c.reshape(r, r).to(torch.float64)
        return _cond(matrix_exp(C), (matrix_exp(-C) * g0[None, :]) / g0[:, None])

    spec = ("gl", r, lt.down, 0, [lt.start])
    scope = f"layer {lt.layer} {lt.name} latent"
    return [Family("latent-gl", scope, gens, f"GL({r})", act, kappa, spec, by_matrix)]


def latent_heads_gl(mh: LatentHeads, params) -> list[Family]:
    """Multi-head latent attention's per-head maps: GL(nope) on each head's unrotated query and key
    rows (q·M, k·M⁻ᵀ), GL(rope) on every head's rotated query rows and the shared rotary key (flat
    where it commutes with the rotations: the rotary commutant), GL(v) on each head's value rows
    and its output columns."""
    qs, kvs = mh.nope + mh.rope, mh.nope + mh.v
    out = []
    for head in range(mh.n_heads):
        sides: list[Side] = [(mh.q, 0, [head * qs], True), (mh.kv_b, 0, [head * kvs], False)]
        out.append(_gl("mla-nope-gl", f"layer {mh.layer} head {head}", params, mh.nope, sides))
    sides = [(mh.q, 0, [head * qs + mh.nope for head in range(mh.n_heads)], True), (mh.kv_a, 0, [mh.rope_start], False)]
    sides.append((mh.rope_bias, 0, [mh.rope_start], False))
    out.append(_gl("mla-rope-gl", f"layer {mh.layer}", params, mh.rope, sides))
    for head in range(mh.n_heads):
        sides = [(mh.kv_b, 0, [head * kvs + mh.nope], True), (mh.o, 1, [head * mh.v], False)]
        out.append(_gl("mla-vo-gl", f"layer {mh.layer} head {head}", params, mh.v, sides))
    return out


def mixer_scale(op: Opaque, params) -> list[Family]:
    """Inside a mixer the project has no theory for: every output row of its stream readers,
    every coordinate of its inner tensors (axis 0: a convolution's channels, a norm's weights)
    and every input column of its writer, each scaled on its own."""
    gens: list[list[Entry]] = [
        [(name, (j,), 1.0, "scale")] for name in op.readers + op.inner for j in range(params[name].shape[0])
    ]
    if op.writer:
        gens += [[(op.writer, (slice(None), j), 1.0, "scale")] for j in range(params[op.writer].shape[1])]
    return [_coordinatewise("mixer-scale", f"layer {op.layer} mixer", params, gens)]


def post_norm_diagonal(desc: Description, params) -> list[Family]:
    """Per post-norm n(y)·γ: each stream coordinate c of the sublayer's output y scaled (its
    writers' output coordinate c) and γ_c scaled back.  Flat only where rms(y) keeps its value,
    i.e. the diagonal preserves the Gram of the writer's rows on its image: none at generic sizes,
    d − f(f+1)/2 directions when the writer's width f is so small that f(f+1)/2 < d."""
    out = []
    for n in desc.post_norms:
        writers = desc.post_writers.get(n.module, [])
        if n.weight is None or not writers:
            continue
        gens: list[list[Entry]] = []
        for c in range(desc.d_model):
            entries = [_norm_entry(n, c, -1.0)]
            for w in writers:
                entries.append((w.param, _index(params[w.param], w.axis, c), 1.0, "scale"))
                if w.bias:
                    entries.append((w.bias, _index(params[w.bias], params[w.bias].dim() - 1, c), 1.0, "scale"))
            gens.append(entries)
        out.append(_coordinatewise("post-norm-diagonal", n.module, params, gens))
    return out


CENTRED = ("layernorm", "layernorm-weightless")  # norms that subtract the mean: blind to 1


def _slices(t: torch.Tensor, axis: int) -> list[tuple]:
    """Every index of ``t`` with ``axis`` left whole: the stream vectors a tensor holds."""
    ranges = [range(n) if ax != axis else [slice(None)] for ax, n in enumerate(t.shape)]
    return list(itertools.product(*ranges))


def _at(idx: tuple, i: int) -> tuple:
    """The entry of stream coordinate ``i`` in the stream vector ``idx`` (one of :func:`_slices`)."""
    return tuple(i if v == slice(None) else v for v in idx)


def _unit(idx: tuple) -> tuple:
    """The index of that stream vector's unit among the tensor's other axes (its bias entry)."""
    return tuple(v for v in idx if v != slice(None))


def _ones_direction(n: Norm, p: Params, d: int) -> torch.Tensor:
    """u = 1/γ of a centring norm at ``p`` (1 without a weight): u·(γ⊙n(x)) = Σ n(x) = 0."""
    g = n.gamma(p)
    return torch.ones(d, dtype=torch.float64) if g is None else 1.0 / g.to(torch.float64)


def _blind_to_ones(desc: Description) -> bool:
    """Every reader of the stream reads it through a centring norm (a LayerNorm): the stream's
    component along 1 is seen by nobody.  (A norm after a sublayer or after the embedding reads
    no stream: it writes into it.)"""
    if not desc.stream_described or not desc.readers:
        return False
    return all(r.norm is not None and r.norm.kind in CENTRED for r in desc.readers)


def _behind_post_norms(desc: Description) -> dict[str, Norm]:
    """A writer whose output passes a norm before the stream → that norm."""
    return {w.param: pn for pn in desc.post_norms for w in desc.post_writers.get(pn.module, [])}


def ln_writer_ones(desc: Description, params) -> list[Family]:
    """Where every reader of the stream reads it through a centring norm (a LayerNorm), the
    stream's component along 1 is seen by nobody: each vector a writer adds (a row of the
    embedding, a column of an output projection, a bias) may gain any multiple of 1 — behind a
    norm only if that norm centres too (BLOOM's embedding LayerNorm) — and so may the shift β of a
    norm whose output enters the stream."""
    if not _blind_to_ones(desc):
        return []
    behind = _behind_post_norms(desc)
    gens: list[list[Entry]] = []
    for w in desc.writers:
        if w.param in behind and behind[w.param].kind not in CENTRED:
            continue
        gens += [[(w.param, idx, 1.0, "shift")] for idx in _slices(params[w.param], w.axis)]
        if w.bias:
            gens += [[(w.bias, idx, 1.0, "shift")] for idx in _slices(params[w.bias], params[w.bias].dim() - 1)]
    gens += [[(pn.bias, (slice(None),), 1.0, "shift")] for pn in desc.post_norms if pn.bias]
    return [_coordinatewise("ln-writer-ones", "stream", params, gens, f"R^{len(gens)}")]


def ln_reader_ones(desc: Description, params) -> list[Family]:
    """A reader of a centring norm's output γ⊙n(x) + β: n(x) ⊥ 1, so each of its output units may
    gain any multiple of u = 1/γ along the stream (u·(γ⊙n) = Σ n = 0), the constant β·u it then
    adds taken back by the unit's bias.  Where β ≠ 0 and a key projection has no bias the constant
    stays, and the forward decides: a key coordinate RoPE leaves unrotated shifts every score of a
    query by one constant, which the softmax does not see (other readers without a bias: not
    proposed — where such a constant is unseen, it is through a tensor another family moves)."""
    keys = {h.k for h in desc.heads if h.k not in (h.q, h.v)}  # a key projection of its own
    out = []
    for r in desc.readers:
        n = r.norm
        if n is None or n.kind not in CENTRED:
            continue
        u = _ones_direction(n, params, desc.d_model)
        beta = params[n.bias].to(torch.float64) if n.bias else None
        if beta is not None and not r.bias and r.param not in keys:
            continue
        t = params[r.param]
        gens: list[list[Entry]] = []
        for idx in _slices(t, r.axis):
            entries: list[Entry] = []
            entries += [(r.param, _at(idx, i), float(u[i]), "shift") for i in range(desc.d_model)]
            if beta is not None and r.bias:
                entries.append((r.bias, _unit(idx), -float(beta @ u), "shift"))
            gens.append(entries)
        fam = _coordinatewise("ln-reader-ones", r.param, params, gens, f"R^{len(gens)}")
        fam.act = partial(_reader_ones, r, desc.d_model, _slices(t, r.axis))
        out.append(fam)
    return out


def _reader_ones(r: Reader, d: int, units: list[tuple], p: Params, c: torch.Tensor) -> Params:
    """The element: unit j of the reader gains c_j·u along the stream, u = 1/γ read at ``p`` (after
    a norm fold or any other element, the shift is along the current γ's u), and its bias −c_j·(β·u)."""
    n = r.norm
    assert n is not None
    u = _ones_direction(n, p, d)
    t = p[r.param]
    delta = torch.stack([c[j] * u for j in range(len(units))])  # one stream vector per unit
    rest = [ax for ax in range(t.dim()) if ax != r.axis]
    moved = delta.reshape([t.shape[ax] for ax in rest] + [d]).movedim(-1, r.axis)
    out = dict(p)
    out[r.param] = t + moved
    if n.bias and r.bias:
        beta = p[n.bias].to(torch.float64)
        out[r.bias] = p[r.bias] - (c * (beta @ u)).reshape(p[r.bias].shape)
    return out


def _affine_norms(desc: Description) -> dict[str, tuple[Norm, list[Reader]]]:
    """Each centring norm with a shift β, by module, with the readers of its output."""
    out: dict[str, tuple[Norm, list[Reader]]] = {}
    for r in desc.readers:
        if r.norm is not None and r.norm.kind in CENTRED and r.norm.bias:
            out.setdefault(r.norm.module, (r.norm, []))[1].append(r)
    return out


def ln_bias_shift(desc: Description, params) -> list[Family]:
    """A LayerNorm's shift β ↦ β + δ, every reader's bias taking back its weight's image of δ
    (b ↦ b − W·δ): where each reader of that norm has a bias (not proposed otherwise)."""
    out = []
    for mod, (n, readers) in _affine_norms(desc).items():
        if any(not r.bias for r in readers):
            continue
        assert n.bias is not None
        gens: list[list[Entry]] = []
        for j in range(desc.d_model):
            entries: list[Entry] = [(n.bias, (j,), 1.0, "shift")]
            for r in readers:
                t, bias = params[r.param], r.bias
                assert bias is not None
                entries += [(bias, _unit(idx), -float(t[_at(idx, j)]), "shift") for idx in _slices(t, r.axis)]
            gens.append(entries)
        fam = _coordinatewise("ln-bias-shift", mod, params, gens, f"R^{len(gens)}")
        fam.act = partial(_bias_shift, n, tuple(readers))
        out.append(fam)
    return out


def _bias_shift(n: Norm, readers: tuple, p: Params, c: torch.Tensor) -> Params:
    """The element: β ↦ β + c, each reader's bias b ↦ b − W·c with W read at ``p``."""
    assert n.bias is not None
    out = dict(p)
    out[n.bias] = p[n.bias] + c
    for r in readers:
        t = p[r.param]
        image = torch.tensordot(t.to(c.dtype), c, dims=([r.axis], [0]))
        out[r.bias] = p[r.bias] - image.reshape(p[r.bias].shape)
    return out


def ln_bias_into_ones(desc: Description, params) -> list[Family]:
    """A LayerNorm's shift β ↦ β + δ where its readers have no bias to take W·δ back: each reader
    takes it back along its ones direction instead, W ↦ W − u·(δW)/((β + δ)·u) with u = 1/γ
    (u·(γ⊙n) = 0, so the reader's image of n is unchanged and the new constant (β + δ)·W′ equals
    β·W).  A flow in δ — two shifts compose to their sum — defined where (β + δ)·u ≠ 0; at a point
    with β·u = 0 it is not proposed."""
    out = []
    d = desc.d_model
    for mod, (n, readers) in _affine_norms(desc).items():
        if all(r.bias for r in readers):  # ln-bias-shift takes it back by the biases
            continue
        assert n.bias is not None
        u = _ones_direction(n, params, d)
        a = float(params[n.bias].to(torch.float64) @ u)
        if abs(a) <= 1e-8 * float(params[n.bias].abs().max()) * float(u.abs().max()) * d:
            continue
        gens: list[list[Entry]] = []
        for j in range(d):
            entries: list[Entry] = [(n.bias, (j,), 1.0, "shift")]
            for r in readers:
                t = params[r.param]
                for idx in _slices(t, r.axis):
                    w = float(t[_at(idx, j)]) / a
                    entries += [(r.param, _at(idx, i), -float(u[i]) * w, "shift") for i in range(d)]
            gens.append(entries)
        fam = _coordinatewise("ln-bias-into-ones", mod, params, gens, f"R^{d}")
        fam.act = partial(_bias_into_ones, n, tuple(readers), d)
        fam.kappa = partial(_bias_into_ones_kappa, params[n.bias].to(torch.float64), u)
        fam.canonical = partial(_bias_into_ones_representative, n, d)
        out.append(fam)
    return out


def _bias_into_ones_kappa(beta: torch.Tensor, u: torch.Tensor, c: torch.Tensor) -> float:
    """The condition number of the readers' map W ↦ (I − u·cᵀ/((β + c)·u))·W."""
    M = torch.eye(u.numel(), dtype=torch.float64) - torch.outer(u, c.to(torch.float64)) / float((beta + c) @ u)
    return _cond(M)


def _bias_into_ones_representative(n: Norm, d: int, p: Params) -> torch.Tensor:
    """Every β′ with β′·u ≠ 0 is on the orbit, its readers following (the two signs of β′·u alike:
    the action is defined across them).  The representative is β′ = u/‖u‖, reached by δ = β′ − β: u
    is the norm's own (1/γ, ±1 after a norm fold), so the choice reads nothing another family
    moves."""
    assert n.bias is not None
    u = _ones_direction(n, p, d)
    return u / u.norm() - p[n.bias].to(torch.float64)


def _bias_into_ones(n: Norm, readers: tuple, d: int, p: Params, c: torch.Tensor) -> Params:
    """The element: β ↦ β + c, each reader W ↦ W − u ⊗ (c·W)/((β + c)·u), γ, β and W read at ``p``."""
    assert n.bias is not None
    u = _ones_direction(n, p, d)
    beta = p[n.bias].to(c.dtype) + c
    out = dict(p)
    out[n.bias] = beta
    for r in readers:
        t = p[r.param]
        image = torch.tensordot(t.to(c.dtype), c, dims=([r.axis], [0]))  # c·W per unit
        moved = (image.unsqueeze(-1) * u / (beta @ u)).movedim(-1, r.axis)
        out[r.param] = t - moved
    return out


def _ffn_writer_biases(desc: Description) -> dict[int, list[str]]:
    """Per block of a parallel residual, the biases its dense FFN writers add to the stream (where
    the mixer's output lands too); nothing for a serial one."""
    if desc.residual != "parallel":
        return {}
    writer_bias = {w.param: w.bias for w in desc.writers if w.bias}
    out: dict[int, list[str]] = {}
    for hd in desc.hidden:
        for name, _ in hd.writers:
            if name in writer_bias and not hd.experts:
                out.setdefault(hd.layer, []).append(writer_bias[name])
    return out


def _landing_biases(desc: Description) -> dict[int, str]:
    """Per layer, a bias added where the attention's output lands in the stream — o_proj's own, or
    in a parallel block the FFN writer's: it can take back a constant the attention adds."""
    out = {layer: biases[0] for layer, biases in _ffn_writer_biases(desc).items()}
    out.update({h.layer: h.ob for h in desc.heads if h.ob})
    return out


def value_ones_into_bias(desc: Description, params) -> list[Family]:
    """A value projection without a bias reading an affine LayerNorm: its unit j gaining c_j·u along
    the stream (u = 1/γ) adds the constant c_j·(β·u) to every value, which the softmax's weights
    (summing to 1) pass on and o_proj maps to (β·u)·W_O·E·c (E: each KV head's values to its query
    heads); a bias added at the same point of the stream takes it back — o_proj's own, or in a
    parallel block the FFN writer's.  W_O, β and u are read where the element acts."""
    landing = _landing_biases(desc)
    out = []
    for h in desc.heads:
        r = next((r for r in desc.readers if r.param == h.v), None)
        bias = landing.get(h.layer)
        if r is None or r.bias or h.v in (h.q, h.k) or r.norm is None or not r.norm.bias or bias is None:
            continue
        units = h.n_kv * h.head_dim
        gens: list[Tangent] = []
        for j in range(units):
            c = torch.zeros(units, dtype=torch.float64)
            c[j] = 1.0
            moved = _value_into_bias(h, r.norm, bias, desc.d_model, params, c)
            gens.append({n: moved[n] - params[n] for n in (h.v, bias)})
        act = partial(_value_into_bias, h, r.norm, bias, desc.d_model)
        out.append(Family("value-ones-into-bias", f"layer {h.layer}", gens, f"R^{units}", act, lambda c: 1.0))
    return out


def _value_into_bias(h: Heads, n: Norm, bias: str, d: int, p: Params, c: torch.Tensor) -> Params:
    """The element: value unit j's row gains c_j·u, ``bias`` loses (β·u)·W_O·E·c (u, β, W_O read at ``p``)."""
    assert n.bias is not None
    u = _ones_direction(n, p, d)
    e, out = h.head_dim, dict(p)
    c = c.to(torch.float64)
    rows = torch.zeros(p[h.v].shape[0], dtype=torch.float64)
    for g, start in enumerate(h.v_starts):
        rows[start : start + e] = c[g * e : (g + 1) * e]
    out[h.v] = p[h.v] + torch.outer(rows, u).to(p[h.v].dtype)
    W = p[h.o].to(torch.float64)
    image = sum(
        W[:, head * e : (head + 1) * e] @ c[(head // h.group) * e : (head // h.group + 1) * e]
        for head in range(h.n_heads)
    )
    out[bias] = p[bias] - (p[n.bias].to(torch.float64) @ u) * image
    return out


def _unseen_values(h: Heads, p: Params, d: int, blind: bool) -> torch.Tensor:
    """Orthonormal columns spanning the constant values c (one entry per KV unit) whose image
    W_O·E·c (E: each KV head's values to its query heads) nobody sees: 0, or a multiple of 1 on a
    stream ``blind`` to 1.  W_O is read at ``p``."""
    W = p[h.o].detach().to(torch.float64)  # d × (n_heads·e): a KV group's query heads are consecutive
    A = W.reshape(d, h.n_kv, h.group, h.head_dim).sum(2).reshape(d, -1)  # W_O·E: d × (n_kv·e)
    if blind:
        A = A - A.mean(0, keepdim=True)  # (I − 11ᵀ/d)·W_O·E
    _, s, vh = torch.linalg.svd(A, full_matrices=True)
    rank = int(above_rounding(A, s).sum())
    return vh[rank:].T


def value_constant_unseen(desc: Description, params) -> list[Family]:
    """A constant added to every value of a KV group passes the softmax's weights (they sum to 1)
    and reaches the stream as W_O·E·c, the same for every token.  Where no bias at that point can
    take it back (value-bias-fold and value-ones-into-bias cover those), c is still unseen when
    W_O·E·c = 0 or, on a stream every reader centres, a multiple of 1: a null space of W_O·E
    (or of its centred rows), generically n_kv·e − d (+ 1) wide.  The constant comes from the
    value bias, or, without one, from each unit's ones shift behind an affine LayerNorm (c·u with
    u = 1/γ adds c·(β·u)).  Its directions follow W_O: they are read where the element acts."""
    landing = _landing_biases(desc)
    blind = _blind_to_ones(desc)
    readers = {r.param: r for r in desc.readers}
    behind = _behind_post_norms(desc)
    out = []
    for h in desc.heads:
        if h.layer in landing:
            continue
        # behind a norm a multiple of 1 is seen (only W_O·E·c = 0 is unseen there)
        seen_ones = not blind or h.o in behind
        r = readers.get(h.v)
        norm: Norm | None = None  # the constant from the value bias, or from the ones shifts behind it
        if not h.vb:
            norm = r.norm if r is not None and r.bias is None else None
            if norm is None or norm.kind not in CENTRED or not norm.bias:
                continue
            if float(params[norm.bias].to(torch.float64) @ _ones_direction(norm, params, desc.d_model)) == 0.0:
                continue
        C = _unseen_values(h, params, desc.d_model, not seen_ones)
        if C.shape[1] == 0:
            continue
        act = partial(_unseen_value, h, norm, desc.d_model, not seen_ones)
        moves = h.vb if norm is None else h.v
        assert moves is not None
        gens = []
        for j in range(C.shape[1]):
            coef = torch.zeros(C.shape[1], dtype=torch.float64)
            coef[j] = 1.0
            gens.append({moves: act(params, coef)[moves] - params[moves]})
        what = f"R^{C.shape[1]}"
        out.append(Family("value-constant-unseen", f"layer {h.layer}", gens, what, act, lambda c: 1.0, read_off=True))
    return out


def _unseen_value(h: Heads, n: Norm | None, d: int, blind: bool, p: Params, coef: torch.Tensor) -> Params:
    """The element: the constant values C·coef (C: :func:`_unseen_values` at ``p``) added through
    the value bias (``n`` None) or the value units' ones shifts behind the norm ``n``.  C and β·u
    are read without their derivatives in ``p`` (C is a null space from an SVD): the family is
    ``read_off``."""
    C = _unseen_values(h, p, d, blind)
    c = C @ coef.to(torch.float64)
    e, out = h.head_dim, dict(p)
    rows = torch.zeros(p[h.v].shape[0], dtype=torch.float64)
    for g, start in enumerate(h.v_starts):
        rows[start : start + e] = c[g * e : (g + 1) * e]
    if n is None:
        assert h.vb is not None
        out[h.vb] = p[h.vb] + rows.to(p[h.vb].dtype)
    else:
        assert n.bias is not None
        u = _ones_direction(n, p, d)
        kappa = float(p[n.bias].detach().to(torch.float64) @ u.detach())  # the constant a ones shift adds
        out[h.v] = p[h.v] + torch.outer(rows / kappa, u).to(p[h.v].dtype)
    return out


def parallel_bias_trade(desc: Description, params) -> list[Family]:
    """In a parallel block the mixer's and the FFN's outputs are added to the stream together, so
    only the sum of their writers' biases is seen: per block, δ added to one writer's bias and
    taken from another's (d per extra biased writer)."""
    by_layer: dict[int, list[str]] = {h.layer: [h.ob] for h in desc.heads if h.ob}
    for layer, biases in _ffn_writer_biases(desc).items():
        by_layer.setdefault(layer, []).extend(biases)
    out = []
    for layer, biases in sorted(by_layer.items()):
        first, *rest = biases
        gens: list[list[Entry]] = [
            [(first, (j,), 1.0, "shift"), (b, (j,), -1.0, "shift")] for b in rest for j in range(desc.d_model)
        ]
        if gens:
            out.append(_coordinatewise("parallel-bias-trade", f"layer {layer}", params, gens, f"R^{len(gens)}"))
    return out


def key_bias_shift(h: Heads, params) -> list[Family]:
    """Per KV group: the key bias's coordinates RoPE leaves unrotated shifted — each query's scores
    gain one constant over the keys, which the softmax does not see (a rotated coordinate turns
    with the position, so its shift is not proposed)."""
    if not h.kb or h.rotary >= h.head_dim:
        return []
    e = h.head_dim
    out = []
    for g in range(h.n_kv):
        gens: list[list[Entry]] = [[(h.kb, (h.k_starts[g] + i,), 1.0, "shift")] for i in range(h.rotary, e)]
        out.append(_coordinatewise("key-bias-shift", f"layer {h.layer} KV group {g}", params, gens, f"R^{len(gens)}"))
    return out


def value_bias_fold(h: Heads, params) -> list[Family]:
    """Per KV group: b_V ↦ b_V + δ and o_proj's bias takes back Σ over the group's heads of
    W_O·δ — values are averaged by weights that sum to 1, so a constant value passes unchanged."""
    if not (h.vb and h.ob):
        return []
    e, out = h.head_dim, []
    W = params[h.o]
    for g in range(h.n_kv):
        gens: list[list[Entry]] = []
        for i in range(e):
            entries: list[Entry] = [(h.vb, (h.v_starts[g] + i,), 1.0, "shift")]
            col = sum(W[:, head * e + i] for head in range(g * h.group, (g + 1) * h.group))
            entries += [(h.ob, (o,), -float(col[o]), "shift") for o in range(W.shape[0])]
            gens.append(entries)
        fam = _coordinatewise("value-bias-fold", f"layer {h.layer} KV group {g}", params, gens, f"R^{e}")
        fam.act = partial(_value_fold, h, g)
        out.append(fam)
    return out


def _value_fold(h: Heads, g: int, p: Params, c: torch.Tensor) -> Params:
    """The element: the group's value bias + c, o_proj's bias − Σ_heads W_O·c with W_O read at ``p``."""
    assert h.vb is not None and h.ob is not None
    e, out = h.head_dim, dict(p)
    lo = h.v_starts[g]
    vb = p[h.vb]
    out[h.vb] = torch.cat([vb[:lo], vb[lo : lo + e] + c, vb[lo + e :]])
    W = p[h.o].to(c.dtype)
    image = sum(W[:, head * e : (head + 1) * e] @ c for head in range(g * h.group, (g + 1) * h.group))
    out[h.ob] = p[h.ob] - image
    return out


def table_offset(desc: Description, params) -> list[Family]:
    """A vector added to every row of the first input table (the tokens') and taken from every row
    of another (learned positions): the stream's first value, their sum, is unchanged."""
    first, *rest = desc.tables
    gens: list[list[Entry]] = [
        [(first, (slice(None), j), 1.0, "shift"), (t, (slice(None), j), -1.0, "shift")]
        for t in rest
        for j in range(desc.d_model)
    ]
    return [_coordinatewise("embed-offset", "input tables", params, gens, f"R^{len(gens)}")] if gens else []


def selection_only(desc: Description, params) -> list[Family]:
    """Every entry of a parameter that only chooses (which experts a token goes to), moved on its
    own: the choice, and so the function, is constant near a point where no choice is tied."""
    return [
        _coordinatewise(
            "selection-only", name, params, [[(name, (j,), 1.0, "shift")] for j in range(params[name].numel())]
        )
        for name in desc.selection
    ]


def continuous(desc: Description, params) -> list[Family]:
    fams: list[Family] = []
    for op in desc.opaque:
        fams += mixer_scale(op, params)
    for h in desc.heads:
        fams += qk_gl(h, params) + qk_norm_scale(h, params) + vo_gl(h, params)
        fams += key_bias_shift(h, params) + value_bias_fold(h, params)
    for lt in desc.latents:
        fams += latent_gl(lt, params)
    for mh in desc.latent_heads:
        fams += latent_heads_gl(mh, params)
    for hd in desc.hidden:
        fams += hidden_scale(hd, params) + router_shift(hd, params, desc.d_model)
    fams += stream_gl(desc, params) + norm_fold(desc, params) + post_norm_diagonal(desc, params)
    fams += ln_writer_ones(desc, params) + ln_reader_ones(desc, params) + ln_bias_shift(desc, params)
    fams += ln_bias_into_ones(desc, params) + value_ones_into_bias(desc, params) + value_constant_unseen(desc, params)
    return fams + parallel_bias_trade(desc, params) + table_offset(desc, params) + selection_only(desc, params)


# ----------------------------------------------------------------------------- discrete
def permute_heads(h: Heads, g: int, p: Params, pi: torch.Tensor) -> Params:
    """The query heads of KV group ``g`` reordered: head i of the group takes old head π[i] (its
    query rows, output columns and sink)."""
    e, G = h.head_dim, h.group
    heads = g * G + pi
    all_rows = torch.arange(p[h.q].shape[0])
    for j, old in enumerate(heads.tolist()):
        new = h.q_starts[g * G + j]
        all_rows[new : new + h.q_stride] = torch.arange(h.q_starts[old], h.q_starts[old] + h.q_stride)
    cols = torch.arange(p[h.o].shape[1])
    cols[g * G * e : (g + 1) * G * e] = (heads[:, None] * e + torch.arange(e)).reshape(-1)
    p = dict(p)
    p[h.q] = p[h.q].index_select(0, all_rows)
    if h.qb:
        p[h.qb] = p[h.qb].index_select(0, all_rows)
    p[h.o] = p[h.o].index_select(1, cols)
    if h.sinks:
        idx = torch.arange(h.n_heads)
        idx[g * G : (g + 1) * G] = heads
        p[h.sinks] = p[h.sinks].index_select(0, idx)
    return p


def permute_kv_groups(h: Heads, p: Params, pi: torch.Tensor) -> Params:
    """KV group i takes old group π[i] with its keys, values, query heads (their rows, output
    columns and sinks) and, for a norm over all heads, their QK-norm entries."""
    e, G = h.head_dim, h.group
    heads = (pi[:, None] * G + torch.arange(G)).reshape(-1)  # the query heads in their new order
    index: dict[str, torch.Tensor] = {}
    for w, b, starts, order, size in (
        (h.q, h.qb, h.q_starts, heads, h.q_stride),
        (h.k, h.kb, h.k_starts, pi, e),
        (h.v, h.vb, h.v_starts, pi, e),
    ):
        for name in (w, b):
            if name:
                idx = index.setdefault(name, torch.arange(p[name].shape[0]))
                for new, old in enumerate(order.tolist()):  # slot ``new`` takes the rows of ``old``
                    idx[starts[new] : starts[new] + size] = torch.arange(starts[old], starts[old] + size)
    p = dict(p)
    for name, idx in index.items():
        p[name] = p[name].index_select(0, idx)
    p[h.o] = p[h.o].index_select(1, (heads[:, None] * e + torch.arange(e)).reshape(-1))
    if h.sinks:
        p[h.sinks] = p[h.sinks].index_select(0, heads)
    if h.qk_norm == "full":
        for n, order in ((h.q_norm, heads), (h.k_norm, pi)):
            if n is not None and n.weight:
                p[n.weight] = p[n.weight].index_select(0, (order[:, None] * e + torch.arange(e)).reshape(-1))
    return p


def kv_group_swap(h: Heads) -> list[Discrete]:
    """KV groups 0 and 1 exchanged with everything that belongs to them."""
    if h.n_kv < 2:
        return []
    return [
        _transposition(
            "kv-group-swap",
            f"layer {h.layer}",
            "KV groups 0 ↔ 1 with their query heads",
            partial(permute_kv_groups, h),
            h.n_kv,
        )
    ]


def _transposition(
    name: str, scope: str, what: str, permute: Callable[[Params, torch.Tensor], Params], n: int
) -> Discrete:
    """The candidate: items 0 ↔ 1 of the permutation group ``permute`` acts by (on ``n`` items)."""
    swap = torch.arange(n)
    swap[:2] = torch.tensor([1, 0])
    return Discrete(name, scope, lambda p: permute(p, swap), what, permute, n)


def _per_group(h: Heads, p: Params, pi: torch.Tensor) -> Params:
    """π of shape (n_kv, group): each KV group's query heads in their own order; (group,): group 0's."""
    for g, row in enumerate(pi if pi.dim() == 2 else pi[None]):
        p = permute_heads(h, g, p, row)
    return p


def head_swap(h: Heads) -> list[Discrete]:
    """Two query heads of one KV group exchanged (queries, output columns, their sinks)."""
    if h.group < 2 or h.qk_norm == "full":
        return []
    return [
        _transposition(
            "head-swap", f"layer {h.layer}", "query heads 0 ↔ 1 of KV group 0", partial(_per_group, h), h.group
        )
    ]


def turn_plane(h: Heads, layout: str, p: Params, plane: int, group: int, quarters: int) -> Params:
    """Rotary plane ``plane`` of the queries and keys of KV group ``group`` turned by ``quarters``
    quarter turns, (x, y) ↦ (−y, x) each, and its QK-norm weights exchanged at every odd one.  The
    plane is (i, i + rotary/2) in the half-split layout, (2i, 2i + 1) interleaved.  A norm weight
    one head long is every group's: then every group turns."""
    e = h.head_dim
    a, b = (plane, plane + h.rotary // 2) if layout == "half-split" else (2 * plane, 2 * plane + 1)
    k = quarters % 4
    if k == 0:
        return p
    perm, signs = torch.arange(e), torch.ones(e, dtype=torch.float64)
    if k % 2:  # (x, y) ↦ (−y, x) or (y, −x): the coordinates exchanged, one negated
        perm[a], perm[b] = b, a
        signs[a if k == 1 else b] = -1.0
    else:  # a half turn: both negated
        signs[a] = signs[b] = -1.0
    return signed_permutation(h, p, perm, signs, group)


def signed_permutation(h: Heads, p: Params, perm: torch.Tensor, signs: torch.Tensor, group: int) -> Params:
    """Every query and key head of KV group ``group`` (every group where one QK-norm weight is all
    heads') with coordinate i taking signs[i]·(old coordinate perm[i]), its QK-norm weights
    permuted alike (an RMS norm is odd: the signs pass through it)."""
    e = h.head_dim
    groups = range(h.n_kv) if h.qk_norm == "head" else [group]
    p = dict(p)
    for g in groups:
        for w, bias, rows in (
            (h.q, h.qb, [_q_rows(h, hd, 0) for hd in range(g * h.group, (g + 1) * h.group)]),
            (h.k, h.kb, [h.k_starts[g]]),
        ):
            for name in (w, bias):
                if not name:
                    continue
                t = p[name].clone()
                for r in rows:
                    block = p[name][r : r + e]
                    t[r : r + e] = signs.to(t.dtype).reshape((e,) + (1,) * (t.dim() - 1)) * block[perm]
                p[name] = t
    if bool((perm != torch.arange(e)).any()):
        for n in (h.q_norm, h.k_norm):
            if n is not None and n.weight:
                if h.qk_norm == "head":
                    starts = [0]
                elif n is h.k_norm:
                    starts = [group * e]
                else:
                    starts = [hd * e for hd in range(group * h.group, (group + 1) * h.group)]
                t = p[n.weight].clone()
                for st in starts:
                    t[st : st + e] = p[n.weight][st : st + e][perm]
                p[n.weight] = t
    return p


def rotary_pair_flips(h: Heads) -> list[Discrete]:
    """A rotary plane's query and key coordinates negated in one KV group (a half turn), and a
    quarter turn with the plane's QK-norm weights exchanged.  The plane is (0, rotary/2) in the
    half-split layout and (0, 1) in the interleaved one: each layout is a candidate."""
    if h.rotary < 2:
        return []
    scope = f"layer {h.layer}" + ("" if h.qk_norm == "head" else " KV group 0")
    out = []
    for layout, p1 in (("half-split", h.rotary // 2), ("interleaved", 1)):
        turn = partial(turn_plane, h, layout)
        out += [
            Discrete(
                "rotary-half-turn",
                scope,
                partial(turn, plane=0, group=0, quarters=2),
                f"plane (0, {p1}) of q/k negated ({layout})",
                items=h.rotary // 2,
                turn=turn,
            ),
            Discrete(
                "rotary-quarter-turn",
                scope,
                partial(turn, plane=0, group=0, quarters=1),
                f"plane (0, {p1}) turned a quarter, its QK-norm weights exchanged ({layout})",
                items=h.rotary // 2,
                turn=turn,
            ),
        ]
    return out


def permute_experts(hd: Hidden, p: Params, pi: torch.Tensor) -> Params:
    """Expert i takes old expert π[i]: its tensors, router row and biases."""
    p = dict(p)
    for name in [n for n, _ in hd.readers + hd.writers] + [hd.router, hd.router_bias, *hd.per_expert]:
        if name and name in p:  # a router buffer is in p when the caller moves buffers too
            p[name] = p[name].index_select(0, pi)
    return p


def expert_swap(hd: Hidden) -> list[Discrete]:
    if hd.experts < 2:
        return []
    return [
        _transposition(
            "expert-swap", hd.name, "experts 0 ↔ 1 with their router rows", partial(permute_experts, hd), hd.experts
        )
    ]


def unit_columns(pi: torch.Tensor, width: int, f: int, layout: str) -> torch.Tensor:
    """The indices along a tensor's hidden axis that put unit π[i] at unit i: the axis holds the
    f units once, or twice fused — ``concat`` [gate | up] (j, f + j), ``interleaved`` (2j, 2j + 1)."""
    if width == f:
        return pi
    if layout == "concat":
        return torch.cat([pi, f + pi])
    return torch.stack([2 * pi, 2 * pi + 1], dim=1).reshape(-1)


def permute_units(hd: Hidden, f: int, layout: str, p: Params, pi: torch.Tensor) -> Params:
    """Unit i takes old unit π[i] in every reader and writer (π per expert when 2-D)."""
    p = dict(p)
    for n, a in hd.readers + hd.writers:
        w = p[n].shape[a]
        if pi.dim() == 1:
            p[n] = p[n].index_select(a, unit_columns(pi, w, f, layout))
        else:
            p[n] = torch.stack([p[n][e].index_select(a - 1, unit_columns(pi[e], w, f, layout)) for e in range(len(pi))])
    return p


def unit_swap(hd: Hidden, params) -> list[Discrete]:
    """Two hidden units exchanged in every reader and the writer; a fused [gate | up] reader pairs
    unit j with columns (j, f + j) or, interleaved, (2j, 2j + 1) — both are candidates."""
    name, axis = hd.writers[0]
    f = params[name].shape[axis]
    if f < 2:
        return []
    layouts = {"": "single"}
    if any(params[n].shape[a] == 2 * f for n, a in hd.readers):
        layouts = {" (fused [gate | up])": "concat", " (fused, interleaved)": "interleaved"}
    return [
        _transposition("unit-swap", hd.name, "hidden units 0 ↔ 1" + label, partial(permute_units, hd, f, layout), f)
        for label, layout in layouts.items()
    ]


def stream_reflection(desc: Description) -> list[Discrete]:
    """Stream coordinate 0 negated: every writer's output and every reader's input coordinate 0
    (a tensor that is both, tied embeddings, once), writers' biases with them — the part of O(d)
    that exp(so(d)) does not reach.  A norm that centres (LayerNorm) is not odd in one coordinate:
    the forward decides."""
    if not desc.stream_described:
        return []
    axes = {(w.param, w.axis) for w in desc.writers} | {(r.param, r.axis) for r in desc.readers}
    biases = {w.bias for w in desc.writers if w.bias}

    def apply(p: Params) -> Params:
        p = dict(p)
        for name, axis in sorted(axes):
            t = p[name].clone()
            t.select(axis, 0).neg_()
            p[name] = t
        for b in sorted(biases):
            t = p[b].clone()
            t.select(-1, 0).neg_()
            p[b] = t
        return p

    return [Discrete("stream-reflection", "stream", apply, "stream coordinate 0 negated in every writer and reader")]


def permute_latent_heads(mh: LatentHeads, p: Params, pi: torch.Tensor) -> Params:
    """Multi-head latent attention's heads reordered: head i takes old head π[i] (its query rows
    [nope | rope], its key and value rows of kv_b, its output columns); the shared rotary key stays."""

    def rows(n: int) -> torch.Tensor:
        return (pi[:, None] * n + torch.arange(n)).reshape(-1)

    p = dict(p)
    p[mh.q] = p[mh.q].index_select(0, rows(mh.nope + mh.rope))
    p[mh.kv_b] = p[mh.kv_b].index_select(0, rows(mh.nope + mh.v))
    p[mh.o] = p[mh.o].index_select(1, rows(mh.v))
    return p


def latent_head_swap(mh: LatentHeads) -> list[Discrete]:
    if mh.n_heads < 2:
        return []
    what = "heads 0 ↔ 1 (query, key and value rows, output columns)"
    return [
        _transposition("latent-head-swap", f"layer {mh.layer}", what, partial(permute_latent_heads, mh), mh.n_heads)
    ]


def discrete(desc: Description, params) -> list[Discrete]:
    out: list[Discrete] = stream_reflection(desc)
    for h in desc.heads:
        out += head_swap(h) + kv_group_swap(h) + rotary_pair_flips(h)
    for mh in desc.latent_heads:
        out += latent_head_swap(mh)
    for hd in desc.hidden:
        out += unit_swap(hd, params) + expert_swap(hd)
    return out
