"""Candidate gauge families of a derived description, as generators in parameter space.

Each continuous family is a Lie algebra given by a spanning set of tangent vectors (one dict of
tensors per generator, in transformers' own tensor layout); the measurement keeps the
subalgebra that is flat on the model's own forward.  A family may therefore be stated *larger*
than the symmetry it hides — GL(d_k) on the queries and keys of a KV group, every scaling of
every hidden coordinate of an FFN, gl(d_model) on the stream — and what survives RoPE, a
QK-norm, an output gate or a clamped GLU is measured, not assumed.

Each discrete candidate is a map on the parameters, tested by the forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..models.derived import Description, Heads, Hidden, Norm, Opaque

Tangent = dict[str, torch.Tensor]


@dataclass
class Family:
    name: str
    scope: str  # the layer or slot it acts on
    generators: list[Tangent]
    what: str  # the candidate group, as stated


@dataclass
class Discrete:
    name: str
    scope: str
    apply: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    what: str


def _zero_like(params, name) -> torch.Tensor:
    return torch.zeros_like(params[name])


def _factor(norm: Norm, params) -> torch.Tensor:
    g = norm.gamma(params)
    assert g is not None
    return g


# ----------------------------------------------------------------------------- heads
def _q_rows(h: Heads, head: int, i: int) -> int:
    return head * h.q_stride + i


def _gl(params, e: int, sides: list[tuple[str | None, int, list[int], bool]]) -> list[Tangent]:
    """The generators E_ab of GL(e) acting on one coordinate space that several tensors hold: each
    side (tensor, axis, offsets of its copies of the space, forward) takes x ↦ x·(I + tE_ab) when
    forward (slot b gains slot a) and the inverse transpose's tangent otherwise (slot a loses b)."""
    gens = []
    for a in range(e):
        for b in range(e):
            t: Tangent = {}
            for name, axis, offsets, forward in sides:
                if name is None:
                    continue
                z = t.setdefault(name, _zero_like(params, name))
                for o in offsets:
                    if forward:
                        z.select(axis, o + b).add_(params[name].select(axis, o + a))
                    else:
                        z.select(axis, o + a).sub_(params[name].select(axis, o + b))
            gens.append(t)
    return gens


def qk_gl(h: Heads, params) -> list[Family]:
    """Per KV group: q ↦ q·M on its query heads, k ↦ k·M⁻ᵀ, M ∈ GL(d_k) (generators E_ab)."""
    e, out = h.head_dim, []
    for g in range(h.n_kv):
        q_rows = [_q_rows(h, head, 0) for head in range(g * h.group, (g + 1) * h.group)]
        sides = [(h.q, 0, q_rows, True), (h.qb, 0, q_rows, True), (h.k, 0, [g * e], False), (h.kb, 0, [g * e], False)]
        out.append(Family("qk-gl", f"layer {h.layer} KV group {g}", _gl(params, e, sides), f"GL({e})"))
    return out


def vo_gl(h: Heads, params) -> list[Family]:
    """Per KV group: v ↦ v·N, and every query head of the group's o_proj columns ↦ N⁻¹·(…)."""
    e, out = h.head_dim, []
    for g in range(h.n_kv):
        o_cols = [head * e for head in range(g * h.group, (g + 1) * h.group)]
        sides = [(h.v, 0, [g * e], True), (h.vb, 0, [g * e], True), (h.o, 1, o_cols, False)]
        out.append(Family("vo-gl", f"layer {h.layer} KV group {g}", _gl(params, e, sides), f"GL({e})"))
    return out


def qk_norm_scale(h: Heads, params) -> list[Family]:
    """Every coordinate of the query and key norms' weights scaled on its own."""
    gens = []
    for n in (h.q_norm, h.k_norm):
        if n is None or n.weight is None:
            continue
        f = _factor(n, params)
        for c in range(f.numel()):
            t = {n.weight: _zero_like(params, n.weight)}
            t[n.weight][c] = f[c]
            gens.append(t)
    return [Family("qk-norm-scale", f"layer {h.layer}", gens, f"(R^×)^{len(gens)}")] if gens else []


# ----------------------------------------------------------------------------- hidden spaces
def _coordinate(t: torch.Tensor, axis: int, j: int, expert: int | None) -> torch.Tensor:
    out = torch.zeros_like(t)
    idx: list = [slice(None)] * t.dim()
    if expert is not None:
        idx[0] = expert
    idx[axis] = j
    out[tuple(idx)] = t[tuple(idx)]
    return out


def hidden_scale(hd: Hidden, params) -> list[Family]:
    """Every reader output and writer input coordinate of the space scaled on its own (per expert)."""
    gens = []
    for e in range(hd.experts) if hd.experts else [None]:
        for name, axis in hd.readers + hd.writers:
            for j in range(params[name].shape[axis]):
                gens.append({name: _coordinate(params[name], axis, j, e)})
    return [Family("ffn-scale", hd.name, gens, f"(R^×)^{len(gens)}")]


def router_shift(hd: Hidden, params, d: int) -> list[Family]:
    """One vector added to every expert's router row (and one constant to every router bias)."""
    if not hd.router:
        return []
    gens: list[Tangent] = []
    for j in range(d):
        t = {hd.router: _zero_like(params, hd.router)}
        t[hd.router][:, j] = 1.0
        gens.append(t)
    if hd.router_bias:
        gens.append({hd.router_bias: torch.ones_like(params[hd.router_bias])})
    return [Family("router-shift", hd.name, gens, f"R^{len(gens)}")]


# ----------------------------------------------------------------------------- the stream
def _slice(t: torch.Tensor, axis: int, c: int) -> torch.Tensor:
    return t.select(axis, c)


def stream_gl(desc: Description, params) -> list[Family]:
    """x ↦ x·(I + tA) on the stream, A ∈ gl(d): writers' outputs follow, each reader behind a norm
    with factor Γ takes −Γ⁻¹AΓ on its input (a norm's shift β: β·Γ⁻¹AΓ), post-norm factors can
    follow only a diagonal A."""
    if desc.residual != "serial":
        return []
    d = desc.d_model
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
                g = r.norm.gamma(params) if r.norm is not None else None
                ratio = 1.0 if g is None else float(g[b] / g[a])
                add(r.param, -ratio * _slice(params[r.param], r.axis, b), r.axis, a)
                if r.norm is not None and r.norm.bias and r.norm.bias not in shifted:
                    shifted.add(r.norm.bias)
                    add(r.norm.bias, ratio * params[r.norm.bias][a], 0, b)
            gens.append(t)
    return [Family("stream-gl", "stream", gens, f"GL({d})")]


def norm_fold(desc: Description, params) -> list[Family]:
    """Each coordinate of a norm's factor scaled, its readers' inputs scaled back."""
    by_norm: dict[str, list] = {}
    norms: dict[str, Norm] = {}
    for r in desc.readers:
        if r.norm is not None and r.norm.weight:
            by_norm.setdefault(r.norm.module, []).append(r)
            norms[r.norm.module] = r.norm
    out = []
    for mod, readers in by_norm.items():
        n = norms[mod]
        f = _factor(n, params)
        gens: list[Tangent] = []
        assert n.weight is not None
        for c in range(f.numel()):
            t: Tangent = {n.weight: _zero_like(params, n.weight)}
            t[n.weight][c] = f[c]
            if n.bias:
                t[n.bias] = _zero_like(params, n.bias)
                t[n.bias][c] = params[n.bias][c]
            for r in readers:
                z = t.setdefault(r.param, _zero_like(params, r.param))
                z.select(r.axis, c).sub_(_slice(params[r.param], r.axis, c))
            gens.append(t)
        out.append(Family("norm-fold", mod, gens, f"(R^×)^{f.numel()}"))
    return out


def mixer_scale(op: Opaque, params) -> list[Family]:
    """Inside a mixer the project has no theory for: every output row of its stream readers,
    every coordinate of its inner tensors (axis 0: a convolution's channels, a norm's weights)
    and every input column of its writer, each scaled on its own."""
    gens = []
    for name in op.readers + op.inner:
        for j in range(params[name].shape[0]):
            gens.append({name: _coordinate(params[name], 0, j, None)})
    if op.writer:
        for j in range(params[op.writer].shape[1]):
            gens.append({op.writer: _coordinate(params[op.writer], 1, j, None)})
    return [Family("mixer-scale", f"layer {op.layer} mixer", gens, f"(R^×)^{len(gens)}")]


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
        f = _factor(n, params)
        gens: list[Tangent] = []
        for c in range(desc.d_model):
            t: Tangent = {n.weight: _zero_like(params, n.weight)}
            t[n.weight][c] = -f[c]
            for w in writers:
                z = t.setdefault(w.param, _zero_like(params, w.param))
                z.select(w.axis, c).add_(_slice(params[w.param], w.axis, c))
                if w.bias:
                    zb = t.setdefault(w.bias, _zero_like(params, w.bias))
                    zb.select(-1, c).add_(params[w.bias].select(-1, c))
            gens.append(t)
        out.append(Family("post-norm-diagonal", n.module, gens, f"(R^×)^{desc.d_model}"))
    return out


def continuous(desc: Description, params) -> list[Family]:
    fams: list[Family] = []
    for op in desc.opaque:
        fams += mixer_scale(op, params)
    for h in desc.heads:
        fams += qk_gl(h, params) + qk_norm_scale(h, params) + vo_gl(h, params)
    for hd in desc.hidden:
        fams += hidden_scale(hd, params) + router_shift(hd, params, desc.d_model)
    fams += stream_gl(desc, params) + norm_fold(desc, params) + post_norm_diagonal(desc, params)
    return fams


# ----------------------------------------------------------------------------- discrete
def _swap(t: torch.Tensor, axis: int, i: list[int], j: list[int]) -> torch.Tensor:
    out = t.clone()
    idx_i, idx_j = torch.tensor(i), torch.tensor(j)
    out.index_copy_(axis, idx_i, t.index_select(axis, idx_j))
    out.index_copy_(axis, idx_j, t.index_select(axis, idx_i))
    return out


def _rows(h: Heads, head: int) -> list[int]:
    return [_q_rows(h, head, i) for i in range(h.q_stride)]


def head_swap(h: Heads) -> list[Discrete]:
    """Two query heads of one KV group exchanged (queries, output columns, their sinks)."""
    if h.group < 2 or h.qk_norm == "full":
        return []
    e = h.head_dim

    def apply(p):
        p = dict(p)
        p[h.q] = _swap(p[h.q], 0, _rows(h, 0), _rows(h, 1))
        if h.qb:
            p[h.qb] = _swap(p[h.qb], 0, _rows(h, 0), _rows(h, 1))
        p[h.o] = _swap(p[h.o], 1, list(range(e)), list(range(e, 2 * e)))
        if h.sinks:
            p[h.sinks] = _swap(p[h.sinks], 0, [0], [1])
        return p

    return [Discrete("head-swap", f"layer {h.layer}", apply, "query heads 0 ↔ 1 of KV group 0")]


def rotary_pair_flips(h: Heads) -> list[Discrete]:
    """A rotary plane's query and key coordinates negated in one KV group (a half turn), and a
    quarter turn with the plane's QK-norm weights exchanged.  The plane is (0, rotary/2) in the
    half-split layout and (0, 1) in the interleaved one: each layout is a candidate."""
    if h.rotary < 2:
        return []
    e = h.head_dim
    per_head_norm = h.qk_norm == "head"
    kv_groups = range(h.n_kv) if per_head_norm else range(1)  # a shared weight turns every group

    def turn(p, quarter: bool, p1: int):
        p = dict(p)
        for g in kv_groups:
            for w, bias, rows in (
                (h.q, h.qb, [_q_rows(h, hd, 0) for hd in range(g * h.group, (g + 1) * h.group)]),
                (h.k, h.kb, [g * e]),
            ):
                for name in (w, bias):
                    if not name:
                        continue
                    t = p[name].clone()
                    for r in rows:
                        x, y = p[name][r].clone(), p[name][r + p1].clone()
                        t[r], t[r + p1] = (-y, x) if quarter else (-x, -y)
                    p[name] = t
        if quarter:
            for n in (h.q_norm, h.k_norm):
                if n is not None and n.weight:
                    heads = 1 if per_head_norm or n is h.k_norm else h.group
                    starts = [hd * e for hd in range(heads)]
                    p[n.weight] = _swap(p[n.weight], 0, starts, [s + p1 for s in starts])
        return p

    scope = f"layer {h.layer}" + ("" if per_head_norm else " KV group 0")
    out = []
    for layout, p1 in (("half-split", h.rotary // 2), ("interleaved", 1)):
        out += [
            Discrete(
                "rotary-half-turn",
                scope,
                partial(turn, quarter=False, p1=p1),
                f"plane (0, {p1}) of q/k negated ({layout})",
            ),
            Discrete(
                "rotary-quarter-turn",
                scope,
                partial(turn, quarter=True, p1=p1),
                f"plane (0, {p1}) turned a quarter, its QK-norm weights exchanged ({layout})",
            ),
        ]
    return out


def expert_swap(hd: Hidden) -> list[Discrete]:
    if hd.experts < 2:
        return []

    def apply(p):
        p = dict(p)
        names = [n for n, _ in hd.readers + hd.writers] + [hd.router, hd.router_bias, *hd.per_expert]
        for name in names:
            if name:
                p[name] = _swap(p[name], 0, [0], [1])
        return p

    return [Discrete("expert-swap", hd.name, apply, "experts 0 ↔ 1 with their router rows")]


def unit_swap(hd: Hidden, params) -> list[Discrete]:
    """Two hidden units exchanged in every reader and the writer; a fused [gate | up] reader pairs
    unit j with columns (j, f + j) or, interleaved, (2j, 2j + 1) — both are candidates."""
    name, axis = hd.writers[0]
    f = params[name].shape[axis]
    if f < 2:
        return []
    layouts = {"": lambda j, w: [j]}
    if any(params[n].shape[a] == 2 * f for n, a in hd.readers):
        layouts = {
            " (fused [gate | up])": lambda j, w: [j, f + j] if w == 2 * f else [j],
            " (fused, interleaved)": lambda j, w: [2 * j, 2 * j + 1] if w == 2 * f else [j],
        }
    out = []
    for label, cols in layouts.items():

        def apply(p, cols=cols):
            p = dict(p)
            for n, a in hd.readers + hd.writers:
                w = p[n].shape[a]
                p[n] = _swap(p[n], a, cols(0, w), cols(1, w))
            return p

        out.append(Discrete("unit-swap", hd.name, apply, "hidden units 0 ↔ 1" + label))
    return out


def discrete(desc: Description, params) -> list[Discrete]:
    out: list[Discrete] = []
    for h in desc.heads:
        out += head_swap(h) + rotary_pair_flips(h)
    for hd in desc.hidden:
        out += unit_swap(hd, params) + expert_swap(hd)
    return out
