"""The theory: every continuous symmetry family, as infinitesimal generators in parameter space.

Each builder returns :class:`Family` objects: a name, a dimension formula (text and
value), the generators as rows of a (k × P) matrix in the flat layout of
:class:`~gauge_audit.nullity.measure.Layout`, and a derivation.  Generators are exact
tangent vectors dθ = d/dt θ(g(t))|₀ of one-parameter subgroups (written out
analytically from the group actions of :mod:`gauge_audit.actions`, extended where the
measurement found more), so J·v = 0 holds up to rounding for every exact family.

Conventions: row vectors (x·W), W_Q (h, d, e), W_O (h, e, d), FFN W_in (d, f),
W_out (f, d), a leading expert axis in MoE blocks (see :mod:`gauge_audit.models.layers`).

Families are built to be linearly independent of one another (where two actions share
directions, one of them is restricted to a complement), so the dimensions add up;
:mod:`.explain` checks that the ranks do.

Kinds:

* ``exact`` — a symmetry of the architecture at every parameter point of the stratum;
* ``eps-broken`` — exact only when the norms' ε is 0 (scale invariance of the norm);
  with ε > 0 its generators have ‖J·v‖ ≈ ε-sized but non-zero, and whether the
  measurement sees them as flat depends on ε against the float64 resolution;
* ``data`` — created by the sampled inputs, not the architecture (dead / always-active
  ReLU units, experts never routed).  Reported, never hidden.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ..actions.stream import norm_readers, stream_writers
from ..models.config import Config
from ..models.layers import rope_planes
from .measure import Genericity, Layout, Problem

LN = ("layernorm", "layernorm-noaffine")
AFFINE = ("layernorm", "rmsnorm")


@dataclass
class Family:
    name: str
    formula: str                 # the dimension formula, in the config's symbols
    expected: int                # the formula evaluated
    vectors: torch.Tensor        # (k × P) generators
    doc: str                     # derivation (one paragraph)
    kind: str = "exact"          # exact | eps-broken | data
    in_gmax: bool = False        # part of MGS G_max (the per-head GL(d_k) × GL(d_v))
    residual: float | None = None   # max ‖J·v‖ / ‖v‖ (set by explain)
    tolerance: float | None = None  # the bound it was checked against (relative to ‖J‖_F)
    rank: int | None = None         # rank of the vectors (set by explain)
    flat: bool = True               # counted as flat (eps-broken: decided against the gap threshold)
    extra: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.vectors.shape[0])


class _Rows:
    """Accumulates tangent vectors; ``new()`` returns a zero vector and ``at(v, name)``
    the writable view of one parameter tensor inside it."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.rows: list[torch.Tensor] = []

    def new(self) -> torch.Tensor:
        v = torch.zeros(self.layout.size, dtype=torch.float64)
        self.rows.append(v)
        return v

    def at(self, v: torch.Tensor, name: str) -> torch.Tensor:
        i = self.layout.names.index(name)
        return v[self.layout.span(name)].view(self.layout.shapes[i])

    def matrix(self) -> torch.Tensor:
        if not self.rows:
            return torch.zeros(0, self.layout.size, dtype=torch.float64)
        return torch.stack(self.rows)


def _fam(layout: Layout, name: str, formula: str, expected: int, rows: _Rows, doc: str, **kw) -> Family:
    return Family(name, formula, int(expected), rows.matrix(), " ".join(doc.split()), **kw)


# ============================================================================ attention
def _attn_prefixes(cfg: Config) -> list[str]:
    return [f"blocks.{i}.attn" for i in range(cfg.n_layers)]


def _qk_basis(cfg: Config) -> list[torch.Tensor]:
    """A basis of gl(d_k), or of the RoPE commutant's Lie algebra (per plane I and J)."""
    e = cfg.d_head
    out = []
    if cfg.pos == "rope":
        for i, j in rope_planes(cfg):
            a = torch.zeros(e, e, dtype=torch.float64)
            a[i, i] = a[j, j] = 1.0
            b = torch.zeros(e, e, dtype=torch.float64)
            b[i, j], b[j, i] = 1.0, -1.0
            out += [a, b]
        return out
    for i in range(e):
        for j in range(e):
            a = torch.zeros(e, e, dtype=torch.float64)
            a[i, j] = 1.0
            out.append(a)
    return out


def qk_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), _Rows(problem.layout)
    g = cfg.group_size
    for pre in _attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for a in _qk_basis(cfg):
                v = R.new()
                for h in range(j * g, (j + 1) * g):
                    R.at(v, f"{pre}.W_Q")[h] = p[f"{pre}.W_Q"][h] @ a
                    if f"{pre}.b_Q" in p:
                        R.at(v, f"{pre}.b_Q")[h] = p[f"{pre}.b_Q"][h] @ a
                R.at(v, f"{pre}.W_K")[j] = -p[f"{pre}.W_K"][j] @ a.T
                if f"{pre}.b_K" in p:
                    R.at(v, f"{pre}.b_K")[j] = -p[f"{pre}.b_K"][j] @ a.T
    rope = cfg.pos == "rope"
    return _fam(problem.layout, "qk-gl", "L·n_kv·d_k" if rope else "L·n_kv·d_k²",
                cfg.n_layers * cfg.n_kv_heads * (cfg.d_head if rope else cfg.d_head ** 2), R,
                """Per KV group j: W_Q[h]·M, b_Q[h]·M for its query heads, W_K[j]·M⁻ᵀ, b_K[j]·M⁻ᵀ keep
                every score q·kᵀ.  Generator for A ∈ gl(d_k): dW_Q = W_Q·A, dW_K = −W_K·Aᵀ.  Under RoPE
                M must commute with every position rotation R_Δ: per frequency plane a·I + b·J
                (GL(1,ℂ)^{d_k/2}, d_k real dimensions).""", in_gmax=True)


def vo_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), _Rows(problem.layout)
    g, e = cfg.group_size, cfg.d_head
    for pre in _attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for a_i in range(e):
                for a_j in range(e):
                    a = torch.zeros(e, e, dtype=torch.float64)
                    a[a_i, a_j] = 1.0
                    v = R.new()
                    R.at(v, f"{pre}.W_V")[j] = p[f"{pre}.W_V"][j] @ a
                    if f"{pre}.b_V" in p:
                        R.at(v, f"{pre}.b_V")[j] = p[f"{pre}.b_V"][j] @ a
                    for h in range(j * g, (j + 1) * g):
                        R.at(v, f"{pre}.W_O")[h] = -a @ p[f"{pre}.W_O"][h]
    return _fam(problem.layout, "vo-gl", "L·n_kv·d_v²", cfg.n_layers * cfg.n_kv_heads * e * e, R,
                """Per KV group j: W_V[j]·N, b_V[j]·N and N⁻¹·W_O[h] for its query heads: the attention
                pattern does not involve V, and A·(X W_V N)(N⁻¹ W_O) = A·X W_V W_O.  Generator:
                dW_V = W_V·A, dW_O = −A·W_O.""", in_gmax=True)


def key_bias_family(problem: Problem) -> Family | None:
    cfg = problem.cfg
    if not cfg.attn_bias or cfg.pos == "rope":
        return None
    R = _Rows(problem.layout)
    for pre in _attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for i in range(cfg.d_head):
                R.at(R.new(), f"{pre}.b_K")[j, i] = 1.0
    return _fam(problem.layout, "key-bias-shift", "L·n_kv·d_k", cfg.n_layers * cfg.n_kv_heads * cfg.d_head, R,
                """b_K enters each score only through q·b_K, constant over the keys of a query, and the
                softmax ignores a constant added to a row: the key bias is entirely flat (absent under
                RoPE, which rotates it with the key position).""")


def value_bias_family(problem: Problem) -> Family | None:
    cfg, p = problem.cfg, problem.params()
    if not cfg.attn_bias or not cfg.out_bias:
        return None
    R, g = _Rows(problem.layout), cfg.group_size
    for pre in _attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for i in range(cfg.d_head):
                v = R.new()
                R.at(v, f"{pre}.b_V")[j, i] = 1.0
                R.at(v, f"{pre}.b_O")[:] = -sum(p[f"{pre}.W_O"][h][i] for h in range(j * g, (j + 1) * g))
    return _fam(problem.layout, "value-bias-fold", "L·n_kv·d_v", cfg.n_layers * cfg.n_kv_heads * cfg.d_head, R,
                """Attention rows sum to 1, so b_V reaches every position as the constant b_V·W_O,
                which b_O can carry instead: db_V = c, db_O = −Σ_h c·W_O[h].""")


# ============================================================================ FFN
def _ffn_units(cfg: Config) -> list[tuple[str, int | None]]:
    """(prefix, expert index or None) for every FFN / expert."""
    out = []
    for i in range(cfg.n_layers):
        if cfg.experts:
            out += [(f"blocks.{i}.moe", e) for e in range(cfg.experts)]
        else:
            out.append((f"blocks.{i}.mlp", None))
    return out


def _sel(t: torch.Tensor, e: int | None) -> torch.Tensor:
    return t if e is None else t[e]


def _unit_key(pre: str, e: int | None) -> str:
    return pre if e is None else f"{pre}[expert {e}]"


def ffn_scaling_family(problem: Problem, gen: Genericity) -> Family | None:
    cfg, p = problem.cfg, problem.params()
    if cfg.family == "attn" or cfg.act not in ("relu", "swiglu"):
        return None
    R = _Rows(problem.layout)
    skipped = 0
    for pre, e in _ffn_units(cfg):
        bad = set(gen.dead.get(_unit_key(pre, e), [])) | set(gen.always_active.get(_unit_key(pre, e), []))
        if gen.unrouted.get(pre) and e in gen.unrouted[pre]:
            bad = set(range(cfg.d_ff))
        for i in range(cfg.d_ff):
            if i in bad:
                skipped += 1
                continue
            v = R.new()
            _sel(R.at(v, f"{pre}.W_in"), e)[:, i] = _sel(p[f"{pre}.W_in"], e)[:, i]
            if f"{pre}.b_in" in p:
                _sel(R.at(v, f"{pre}.b_in"), e)[i] = _sel(p[f"{pre}.b_in"], e)[i]
            _sel(R.at(v, f"{pre}.W_out"), e)[i] = -_sel(p[f"{pre}.W_out"], e)[i]
    n_units = cfg.n_layers * max(cfg.experts, 1)
    formula = "L·E·d_ff" if cfg.experts else "L·d_ff"
    if cfg.act == "relu":
        doc = """ReLU is positively homogeneous: relu(s·z) = s·relu(z) for s > 0, so per hidden unit
              W_in[:, i]·s, b_in[i]·s, W_out[i]/s.  (GELU and SiLU are not homogeneous: no such family.)"""
    else:
        doc = """SwiGLU's hidden unit silu(x·w_gate)·(x·w_up) is linear in the up projection, so per unit
              W_in[:, i]·s (and b_in[i]), W_out[i]/s, with W_gate untouched."""
    fam = _fam(problem.layout, f"{cfg.act}-scaling", formula + (" − excluded units" if skipped else ""),
               n_units * cfg.d_ff - skipped, R, doc)
    return fam


@dataclass
class _FirstPoints:
    """The finitely many points X0 at which block 0 reads the stream, their first-norm outputs Y
    and the readers of that norm."""

    X0: torch.Tensor
    Y: torch.Tensor
    norm: object                   # x ↦ the first norm's output
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
    from ..models.layers import normalize
    cfg, p = problem.cfg, problem.params()
    if cfg.family == "attn" or cfg.norm_placement != "pre" or "embed.W_E" not in p:
        return None
    X0 = p["embed.W_E"]
    if "embed.W_pos" in p:
        X0 = (X0[:, None, :] + p["embed.W_pos"][None, :, :]).reshape(-1, cfg.d_model)
    if X0.shape[0] > 100_000:     # far beyond the sizes a Jacobian nullity can be measured at
        return None

    def first_norm(x):
        return normalize(p, "blocks.0.ln1", cfg, x)
    return _FirstPoints(X0, first_norm(X0), first_norm, pre_norm_readers(cfg, p)["blocks.0.ln1"])


def _add_input_offset(problem: Problem, pts: _FirstPoints, R: _Rows, v: torch.Tensor, w: torch.Tensor,
                      values: torch.Tensor | None) -> None:
    """Adds to v: every row of W_E moved by −w, block 0's readers re-solved so that their outputs
    on the moved points are unchanged — except W_V's, which gain the constant ``values`` (one
    per value column) on every point.  Needs independent points (Y·Y⁺ = I)."""
    from torch.func import jvp
    p, d = problem.params(), problem.cfg.d_model
    dY = jvp(pts.norm, (pts.X0,), (-w.expand_as(pts.X0),))[1]
    R.at(v, "embed.W_E")[...] -= w
    for name, _ in pts.readers:
        W = _reader_value(p, name).reshape(d, -1)
        target = torch.zeros(pts.Y.shape[0], W.shape[1], dtype=torch.float64)
        if values is not None and name.endswith(".W_V"):
            target[:] = values
        rows = _reader_rows(R, v, name)
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
        R, count = _Rows(layout), 0
        for a in vh[rank:]:
            for w, _ in readers:
                for col in range(_reader_value(p, w).reshape(d, -1).shape[1]):
                    v = R.new()
                    _set_reader_column(R, v, w, col, a)
                    count += 1
        fams.append(_fam(layout, "unreached-readers", "(d−rank Y)·(h·d_k+n_kv·(d_k+d_v))", count, R,
                         """Without learned positions block 0's first norm has finitely many outputs Y (one
                         per token); when they do not span R^d, its readers may add any a ⊥ span(Y) to any
                         column — they never see that direction."""))
    if not pts.independent:
        return fams
    # Y has linearly independent rows: every reader's outputs on them can be set at will (Y·Y⁺ = I)
    ones = pts.pinv.sum(1)                               # Y·ones = 1: a constant on every input
    pre = "blocks.0.attn"
    R, count = _Rows(layout), 0
    for w, b in readers:
        if b is None or cfg.norm == "layernorm":     # affine LayerNorm: ln-reader-ones already trades
            continue
        for col in range(_reader_value(p, w).reshape(d, -1).shape[1]):
            v = R.new()
            R.at(v, b).view(-1)[col] = 1.0
            _set_reader_column(R, v, w, col, -ones)
            count += 1
    if count:
        fams.append(_fam(layout, "bias-trade", "width of the biased readers", count, R,
                         """The first norm's outputs Y (one per token) are linearly independent, so a
                         biased reader's bias may take over a constant from its weights: b ↦ b + c,
                         W ↦ W − Y⁺·1⊗c."""))
    if cfg.tied:
        return fams            # W_E is also the unembedding: see tied_unembed_family
    R, count = _Rows(layout), 0
    if f"{pre}.b_O" in p:
        # b_O absorbs any offset w (along 1 under a LayerNorm it is already ln-writer-ones)
        ws = _complement_of_ones(d) if cfg.norm in LN else torch.eye(d, dtype=torch.float64)
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
    fams.append(_fam(layout, "input-offset", formula, count, R,
                     """The first norm's outputs Y (one per token) are linearly independent: every row
                     of W_E may move by −w if block 0 puts w back — through b_O, or as a constant added
                     to a KV group's values by W_V (w = c·Σ_{h∈group} W_O[h]) — with the readers
                     re-solved for the moved points (Y·δW = target − δY·W)."""))
    return fams


def data_families(problem: Problem, gen: Genericity) -> list[Family]:
    """Flat directions created by the sample, not by the architecture."""
    cfg, p = problem.cfg, problem.params()
    out = []
    R, count = _Rows(problem.layout), 0
    for pre, e in _ffn_units(cfg):
        key = _unit_key(pre, e)
        if gen.unrouted.get(pre) and e in gen.unrouted[pre]:
            continue
        for i in gen.dead.get(key, []):
            for name, idx in ((f"{pre}.W_in", (slice(None), i)), (f"{pre}.W_out", (i, slice(None)))):
                for r in range(cfg.d_model):
                    v = R.new()
                    sl = _sel(R.at(v, name), e)
                    if name.endswith("W_in"):
                        sl[r, i] = 1.0
                    else:
                        sl[i, r] = 1.0
                    count += 1
            if f"{pre}.b_in" in p:
                _sel(R.at(R.new(), f"{pre}.b_in"), e)[i] = 1.0
                count += 1
    if count:
        out.append(_fam(problem.layout, "dead-relu-units", "(2d + [b_in]) per dead unit", count, R,
                        """A ReLU unit that is never positive on the sample contributes nothing and stays
                        dead under small changes of its input weights and bias: all of its weights are
                        flat for this data (not a symmetry of the architecture).""", kind="data"))
    R, count = _Rows(problem.layout), 0
    for pre, e in _ffn_units(cfg):
        act = gen.always_active.get(_unit_key(pre, e), [])
        if not act:
            continue
        s = torch.tensor(act)
        for a_i in range(len(act)):
            for a_j in range(len(act)):
                v = R.new()
                w_in, w_out = _sel(p[f"{pre}.W_in"], e), _sel(p[f"{pre}.W_out"], e)
                _sel(R.at(v, f"{pre}.W_in"), e)[:, s[a_j]] = w_in[:, s[a_i]]
                if f"{pre}.b_in" in p:
                    _sel(R.at(v, f"{pre}.b_in"), e)[s[a_j]] = _sel(p[f"{pre}.b_in"], e)[s[a_i]]
                _sel(R.at(v, f"{pre}.W_out"), e)[s[a_i]] -= w_out[s[a_j]]
                count += 1
        if f"{pre}.b_in" in p and f"{pre}.b_out" in p:
            for i in act:   # a linear unit's bias reaches the output as the constant b_in[i]·W_out[i]
                v = R.new()
                _sel(R.at(v, f"{pre}.b_in"), e)[i] = 1.0
                _sel(R.at(v, f"{pre}.b_out"), e)[...] = -_sel(p[f"{pre}.W_out"], e)[i]
                count += 1
    if count:
        out.append(_fam(problem.layout, "always-active-relu-units",
                        "|S|² (+|S| with b_in, b_out) per FFN (S: always-active units)",
                        count, R,
                        """ReLU units that are positive on the whole sample act linearly there, so any
                        GL(|S|) mixing of them (W_in·A, A⁻¹·W_out) is flat for this data, and their
                        biases reach the output as constants that b_out can carry.""", kind="data"))
    R, count = _Rows(problem.layout), 0
    for pre, experts in gen.unrouted.items():
        for e in experts:
            for name in (f"{pre}.W_in", f"{pre}.W_gate", f"{pre}.W_out", f"{pre}.b_in", f"{pre}.b_gate",
                         f"{pre}.b_out"):
                if name in p:
                    for flat in range(p[name][e].numel()):
                        v = R.new()
                        R.at(v, name)[e].view(-1)[flat] = 1.0
                        count += 1
            if cfg.top_k > 1:
                for r in range(cfg.d_model):
                    R.at(R.new(), f"{pre}.W_router")[r, e] = 1.0
                    count += 1
    if count:
        out.append(_fam(problem.layout, "unrouted-experts", "all parameters of experts never in a top-k",
                        count, R, """An expert that the sample never routes to has no effect on it.""",
                        kind="data"))
    R, count = _Rows(problem.layout), 0
    for pre, per in gen.unreached.items():
        for e, dirs in per.items():
            for a in dirs:
                for name in (f"{pre}.W_in", f"{pre}.W_gate"):
                    if name in p:
                        for col in range(p[name].shape[-1]):
                            v = R.new()
                            R.at(v, name)[e][:, col] = a
                            count += 1
    if count:
        out.append(_fam(problem.layout, "expert-unreached-readers", "(d − rank of its routed inputs)·(reader width)",
                        count, R, """An expert whose routed inputs all lie in a proper subspace cannot see
                        its readers' (W_in, W_gate) components orthogonal to it.""", kind="data"))
    return out


def router_family(problem: Problem) -> Family | None:
    cfg = problem.cfg
    if not cfg.experts:
        return None
    R = _Rows(problem.layout)
    d, E = cfg.d_model, cfg.experts
    if cfg.top_k == 1:
        for i in range(cfg.n_layers):
            for r in range(d):
                for e in range(E):
                    R.at(R.new(), f"blocks.{i}.moe.W_router")[r, e] = 1.0
        return _fam(problem.layout, "router-top1", "L·d·E", cfg.n_layers * d * E, R,
                    """With top_k = 1 the renormalised gate is identically 1: the router only selects,
                    and selection is locally constant, so every router weight is flat.""")
    # LayerNorm-noaffine readers also get the all-ones direction per column (reader-ones); the
    # offset along 1 is then already there, so the offset is restricted to 1^⊥.
    basis = _complement_of_ones(d) if cfg.norm == "layernorm-noaffine" and cfg.norm_placement == "pre" \
        else torch.eye(d, dtype=torch.float64)
    for i in range(cfg.n_layers):
        for c in basis:
            R.at(R.new(), f"blocks.{i}.moe.W_router")[:, :] = c[:, None].expand(d, E)
    noaff = cfg.norm == "layernorm-noaffine" and cfg.norm_placement == "pre"
    return _fam(problem.layout, "router-offset", "L·(d−1)" if noaff else "L·d", cfg.n_layers * basis.shape[0], R,
                """Adding the same vector c to every expert's router column adds x·c to every router
                logit: softmax, top-k and the renormalised gates are unchanged.""")


# ============================================================================ stream / norms
def _complement_of_ones(d: int) -> torch.Tensor:
    """An orthonormal basis (rows) of 1^⊥ in R^d."""
    m = torch.eye(d, dtype=torch.float64) - torch.full((d, d), 1.0 / d, dtype=torch.float64)
    q, _ = torch.linalg.qr(m[:, : d - 1])
    return q.T.contiguous()


def pre_norm_readers(cfg: Config, p: dict) -> dict[str, list[tuple[str, str | None]]]:
    """norm prefix → [(reader weight, its bias or None)] as the stream actions define them,
    plus a tied final norm's reader, written as ``embed.W_E^T``."""
    out = norm_readers(cfg, p)
    if cfg.tied:
        out["ln_final"] = [("embed.W_E^T", None)]
    return out


pre_norm_writers = stream_writers


def _reader_rows(R: _Rows, v: torch.Tensor, name: str) -> torch.Tensor:
    """The reader weight with d_model moved to the front: (d, *rest), as a writable view.
    ``embed.W_E^T`` is W_Eᵀ (d, vocab)."""
    if name == "embed.W_E^T":
        return R.at(v, "embed.W_E").T
    return R.at(v, name).movedim(-2, 0)


def _set_reader_column(R: _Rows, v: torch.Tensor, name: str, col: int, a: torch.Tensor) -> None:
    """Set reader column ``col`` (flat index over the reader's non-d axes, in the order of
    its bias) to the d-vector ``a``."""
    if name == "embed.W_E^T":
        R.at(v, "embed.W_E")[col, :] = a
        return
    t = R.at(v, name)                       # (*lead, d, f)
    lead, f = t.shape[:-2], t.shape[-1]
    idx = []
    rem = col
    for size in (*lead, f)[::-1]:
        idx.append(rem % size)
        rem //= size
    *lead_idx, fi = idx[::-1]
    t[(*lead_idx, slice(None), fi)] = a


def _reader_ones(problem: Problem, R: _Rows, norm: str, readers: list[tuple[str, str | None]]) -> int:
    """LayerNorm's output y = γ⊙n + β has n ⊥ 1, so y·γ⁻¹ = β·γ⁻¹ is the same for every input
    (y·1 = 0 without affine).  So each output column of a reader may add γ⁻¹ (resp. 1) to its
    weights; the reader's output then moves by the constant β·γ⁻¹, which (a) its bias absorbs,
    (b) is invisible for a key column (constant over the keys of a query; not under RoPE, which
    rotates it), (c) for a value column reaches the output as a constant that b_O absorbs.
    Without affine there is nothing to absorb.  (MoE router with affine LN: the uniform column
    pattern is the router offset; single columns would change the softmax.)"""
    cfg, p, d = problem.cfg, problem.params(), problem.cfg.d_model
    if cfg.norm == "layernorm":
        a, c = 1.0 / p[f"{norm}.w"], float((p[f"{norm}.b"] / p[f"{norm}.w"]).sum())
    else:
        a, c = torch.ones(d, dtype=torch.float64), 0.0
    count = 0
    for w, b in readers:
        b = b if (b is not None and b in p) else None
        pre = w.rsplit(".", 1)[0]
        if c == 0.0 or b is not None:
            mode = "bias"
        elif w.endswith(".W_K") and cfg.pos != "rope":
            mode = "key"
        elif w.endswith(".W_V") and f"{pre}.b_O" in p:
            mode = "fold"
        else:
            continue
        cols = _reader_value(p, w).reshape(d, -1).shape[1]
        for col in range(cols):
            v = R.new()
            _set_reader_column(R, v, w, col, a)
            if mode == "bias" and b is not None and c != 0.0:
                R.at(v, b).view(-1)[col] = -c
            elif mode == "fold":
                j, e = divmod(col, cfg.d_head)
                for h in range(j * cfg.group_size, (j + 1) * cfg.group_size):
                    R.at(v, f"{pre}.b_O")[...] -= c * p[f"{pre}.W_O"][h][e]
            count += 1
    return count


def _has(p: dict, name: str) -> bool:
    return name in p or (name == "embed.W_E^T" and "embed.W_E" in p)


def _reader_value(p: dict, name: str) -> torch.Tensor:
    if name == "embed.W_E^T":
        return p["embed.W_E"].T
    return p[name].movedim(-2, 0)


def _is_router(name: str) -> bool:
    return name.endswith("W_router")


def _writer_rows(t: torch.Tensor) -> torch.Tensor:
    """A writer tensor as (rows, d)."""
    return t.reshape(-1, t.shape[-1])


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
        R = _Rows(layout)
        for n in transformable:
            for i in range(d):
                v = R.new()
                R.at(v, f"{n}.w")[i] = p[f"{n}.w"][i]
                if f"{n}.b" in p:
                    R.at(v, f"{n}.b")[i] = p[f"{n}.b"][i]
                for w, _ in transformable[n]:
                    _reader_rows(R, v, w)[i] = -_reader_value(p, w)[i]
        k = len(transformable)
        fams.append(_fam(layout, "norm-scale", "(2L+1)·d" if not tied else "2L·d", k * d, R,
                         """Per weighted pre-norm: γ⊙s, β⊙s and every reader diag(s)⁻¹·W (the readers see
                         (n(x)⊙γ⊙s + β⊙s)·diag(s)⁻¹·W = (n(x)⊙γ + β)·W).  Not for a tied final norm, whose
                         reader W_Eᵀ is also a writer."""))

    # ---------------------------------------------------------------- norm shift (affine LayerNorm)
    if norm == "layernorm":
        R = _Rows(layout)
        for n, rs in transformable.items():
            gamma, beta = p[f"{n}.w"], p[f"{n}.b"]
            c = float((beta / gamma).sum())
            for i in range(d):
                v = R.new()
                R.at(v, f"{n}.b")[i] = 1.0
                for w, b in rs:
                    row = _reader_value(p, w)[i]           # (*rest): what β_i adds to the reader's output
                    if b is not None:
                        R.at(v, b)[...] = -row
                    else:
                        # dW = γ⁻¹ ⊗ u with u = −row/(β·γ⁻¹): the reader's new all-ones response
                        # (β·γ⁻¹)·u cancels δβ·W.
                        _reader_rows(R, v, w)[...] = (1.0 / gamma).reshape(d, *([1] * row.dim())) * (-row / c)
        k = len(transformable)
        fams.append(_fam(layout, "norm-shift", "(2L+1)·d" if not tied else "2L·d", k * d, R,
                         """Per affine LayerNorm: β ↦ β + δ.  A reader with a bias absorbs it (b ↦ b − δ·W);
                         a reader without one absorbs it in its weights: LayerNorm's output y = γ⊙n + β lies
                         in the hyperplane y·γ⁻¹ = β·γ⁻¹ (n ⊥ 1), so W ↦ W + γ⁻¹⊗u changes the reader's
                         output by the constant (β·γ⁻¹)·u, and u = −δ·W/(β·γ⁻¹) cancels δ·W.  Exists for
                         every affine LN (generic β·γ⁻¹ ≠ 0), biases or not."""))

    # ---------------------------------------------------------------- reader ones (LayerNorm)
    if norm in LN:
        R, count = _Rows(layout), 0
        for n, rs in readers.items():
            if tied and n == "ln_final":
                continue  # W_E rows along 1: counted with the writers (noaffine) / not flat (affine)
            count += _reader_ones(problem, R, n, rs)
        if count:
            fams.append(_fam(layout, "ln-reader-ones", "Σ over LN readers of their output width"
                             + (" (readers that can absorb a constant)" if norm == "layernorm" else ""), count, R,
                             _reader_ones.__doc__))

    # ---------------------------------------------------------------- writer ones (LayerNorm)
    if norm in LN:
        R = _Rows(layout)
        count = 0
        for w in writers:
            if w == "embed.W_E" and tied and norm == "layernorm":
                continue  # W_E is also read by an affine final norm: y·1 = γ·n + β·1 is not constant
            rows = _writer_rows(p[w]).shape[0]
            for r in range(rows):
                v = R.new()
                _writer_rows(R.at(v, w))[r] = 1.0
                count += 1
        # Without b_O, a constant w added to the values (through b_V, or through W_V's reader-ones
        # under an affine LN) reaches the stream as Σ_h w·W_O[h]; the w whose image is ∝ 1 are flat.
        if "blocks.0.attn.b_O" not in p and ("blocks.0.attn.b_V" in p or norm == "layernorm"):
            for i in range(L):
                pre, ln1 = f"blocks.{i}.attn", f"blocks.{i}.ln1"
                M = torch.zeros(cfg.n_kv_heads * cfg.d_head, d, dtype=torch.float64)
                for h in range(cfg.n_heads):
                    j = h // cfg.group_size
                    M[j * cfg.d_head:(j + 1) * cfg.d_head] += p[f"{pre}.W_O"][h]
                for wc in _null_rows((M - M.mean(-1, keepdim=True)).T, M.shape[0]):
                    v = R.new()
                    w = wc.reshape(cfg.n_kv_heads, cfg.d_head)
                    if f"{pre}.b_V" in p:
                        R.at(v, f"{pre}.b_V")[...] = w
                    else:
                        bg = float((p[f"{ln1}.b"] / p[f"{ln1}.w"]).sum())
                        R.at(v, f"{pre}.W_V")[...] = (1.0 / p[f"{ln1}.w"])[None, :, None] * (w / bg)[:, None, :]
                    count += 1
        fams.append(_fam(layout, "ln-writer-ones", "rows of every stream writer (W_E, W_pos, W_O, b_O, "
                         "W_out, b_out)" + (" except W_E" if tied and norm == "layernorm" else ""), count, R,
                         """Every reader of the residual stream is a LayerNorm, which subtracts the mean:
                         the all-ones component of the stream is invisible, so every row of every writer
                         may add any multiple of 1."""))

    # ---------------------------------------------------------------- embedding offset
    if "embed.W_pos" in p and not tied:
        fams.append(_embed_offset(problem, [("embed.W_E", "embed.W_pos")], ones=norm in LN))

    # ---------------------------------------------------------------- translations (no norm)
    if norm == "none":
        segs = []
        # the first stretch is opened by a whole embedding table (W_pos when W_E is also the unembedding)
        opening = [("embed.W_pos" if tied else "embed.W_E", "rows")]
        for i in range(L):
            b = f"blocks.{i}"
            ffn = f"{b}.moe" if cfg.experts else f"{b}.mlp"
            segs.append(Segment(opening, readers[f"{b}.ln1"], f"{b}.attn.b_O", False, f"attn {i}"))
            segs.append(Segment([(f"{b}.attn.b_O", "bias")], readers[f"{b}.ln2"], f"{ffn}.b_out", False,
                                f"ffn {i}"))
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
        R = _Rows(layout)
        v = R.new()
        for w in writers:
            R.at(v, w)[...] = p[w]
        if tied:
            for t in ("w", "b"):
                if f"ln_final.{t}" in p:
                    R.at(v, f"ln_final.{t}")[...] = -p[f"ln_final.{t}"]
        fams.append(_fam(layout, "stream-scale", "1", 1, R,
                         """Every writer ×c scales the stream, which every norm divides out — exactly only
                         when ε = 0 (n(c·x) = x/√(mean x² + ε/c²)).  Tied: the final γ, β ×1/c keep the
                         logits.""", kind="exact" if cfg.norm_eps == 0 else "eps-broken"))
    return fams


def _embed_offset(problem: Problem, pairs: list[tuple[str, str]], ones: bool) -> Family:
    d = problem.cfg.d_model
    basis = _complement_of_ones(d) if ones else torch.eye(d, dtype=torch.float64)
    R = _Rows(problem.layout)
    for a, b in pairs:
        for c in basis:
            v = R.new()
            R.at(v, a)[...] = c
            R.at(v, b)[...] = -c
    n = len(pairs)
    formula = ("(d−1)" if ones else "d") + (f"·{n}" if n > 1 else "")
    return _fam(problem.layout, "embed-offset", formula, n * basis.shape[0], R,
                """The stream starts as W_E[t] + W_pos[p] (+ W_tt[τ]): a vector c added to every row of
                one table and subtracted from every row of W_pos leaves every sum unchanged (along 1 it
                is already a writer-ones direction when a LayerNorm follows).""")


def _stream_map_family(problem: Problem, readers: dict, writers: list[str]) -> Family | None:
    """so(d) / so(1^⊥) / gl(d) acting on the residual stream (pre-norm)."""
    cfg, layout = problem.cfg, problem.layout
    d, norm, tied = cfg.d_model, cfg.norm, cfg.tied
    if tied and norm in AFFINE:
        return None
    if norm == "none":
        if tied:
            gens = _skew_basis(torch.eye(d, dtype=torch.float64))
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
        gens = _skew_basis(_complement_of_ones(d).T)
        name, formula = "stream-rotation", "(d−1)(d−2)/2"
    else:
        gens = _skew_basis(torch.eye(d, dtype=torch.float64))
        name, formula = "stream-rotation", "d(d−1)/2"
    R = _Rows(layout)
    for a in gens:
        _stream_map_vector(problem, R, R.new(), a, readers, writers)
    doc = {"stream-gl": """Without norms the stream is read only linearly: any invertible A with writers W·A
                         and readers A⁻¹·W.""",
           "stream-rotation": """Norm cores commute with isometries of the stream (LayerNorm: those fixing 1).
                         Writers W·R; for a norm with weight γ, C = D_γ⁻¹·R·D_γ, β·C and readers C⁻¹·W (the
                         corrected rule).  Tied with an affine final norm: none (R would have to commute
                         with diag(γ_final))."""}[name]
    return _fam(layout, name, formula, len(gens), R, doc)


def _stream_map_vector(problem: Problem, R: _Rows, v: torch.Tensor, a: torch.Tensor, readers: dict,
                       writers: list[str]) -> None:
    """The tangent of x ↦ x·(I + t·A) on the stream: writers W·A; for a norm with weight γ,
    C = D_γ⁻¹·A·D_γ, β·C and readers −C·W.  A tied final norm is left to the caller."""
    p, d, tied = problem.params(), problem.cfg.d_model, problem.cfg.tied
    for w in writers:
        R.at(v, w)[...] = p[w] @ a
    for n, rs in readers.items():
        if tied and n == "ln_final":
            continue  # W_Eᵀ follows the writer rule: (W_E·R)ᵀ = Rᵀ·W_Eᵀ, as the reader rule asks
        if f"{n}.w" in p:
            gamma = p[f"{n}.w"]
            c = a * gamma[None, :] / gamma[:, None]      # D_γ⁻¹·A·D_γ
        else:
            c = a
        if f"{n}.b" in p:
            R.at(v, f"{n}.b")[...] = p[f"{n}.b"] @ c
        for w, _ in rs:
            rv = _reader_value(p, w)
            _reader_rows(R, v, w)[...] = -(c @ rv.reshape(d, -1)).reshape(rv.shape)


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
    if not (cfg.tied and cfg.norm in AFFINE and cfg.norm_placement == "pre" and "ln_final.w" in p):
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
    cols = [torch.cat([(Mk @ E.T).reshape(-1), skew(Mk).sum(1) if ln else torch.zeros(0, dtype=torch.float64)])
            for Mk in basis_m]
    if ln:
        # LayerNorm: W_E may also move by s⊗1 (invisible to every norm; the logits move by
        # s_t·(n·γ + β·1), which γ·sᵀ in the first condition and δβ below cancel)
        for j in range(V):                       # w_j
            e = torch.zeros(d, V, dtype=torch.float64)
            e[:, j] = -1.0
            cols.append(torch.cat([e.reshape(-1), torch.zeros(d, dtype=torch.float64)]))
        for j in range(V):                       # s_j
            e = torch.zeros(d, V, dtype=torch.float64)
            e[:, j] = gamma
            cols.append(torch.cat([e.reshape(-1), torch.zeros(d, dtype=torch.float64)]))
    # block 0 may move W_E by −w and put w back through its values (independent points, no b_O):
    # as an unembedding, W_E − 1⊗w moves every logit by −(n·D_γ + β)·w
    pts = _first_points(problem)
    offsets: list = []
    if pts is not None and pts.independent:
        if "blocks.0.attn.b_O" in p:     # b_O puts any w back (along 1 under LN: ln-writer-ones)
            ws = _complement_of_ones(d) if cfg.norm in LN else torch.eye(d, dtype=torch.float64)
            offsets = [(None, w) for w in ws]
        else:
            offsets = _value_offsets(problem)
    for _, w in offsets:
        e = -(gamma * w)[:, None].expand(d, V)
        cols.append(torch.cat([e.reshape(-1), torch.zeros(d if ln else 0, dtype=torch.float64)]))
    C = torch.stack(cols, dim=1)
    _, cs, cvh = torch.linalg.svd(C, full_matrices=True)
    null = cvh[int((cs > 1e-10 * cs[0]).sum()):]
    n_s = 2 * V if ln else 0
    R, count = _Rows(layout), 0
    for x in null:
        M = (x[:n_m, None, None] * basis_m).sum(0)
        A = skew(M)
        v = R.new()
        _stream_map_vector(problem, R, v, A, readers, writers)
        R.at(v, "ln_final.w")[...] = torch.diagonal(M)
        coef = x[n_m + n_s:]
        w_tot = sum((a * w for a, (_, w) in zip(coef, offsets)), torch.zeros(d, dtype=torch.float64))
        if offsets and offsets[0][0] is None:
            _add_input_offset(problem, pts, R, v, w_tot, None)
            R.at(v, "blocks.0.attn.b_O")[...] += w_tot
        elif offsets:
            _add_input_offset(problem, pts, R, v, w_tot, sum(a * c for a, (c, _) in zip(coef, offsets)))
        if ln:
            beta, sv_ = p["ln_final.b"], x[n_m + V:n_m + 2 * V]
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
    return _fam(layout, "tied-unembed-null", "null space of its conditions", count, R,
                """Tied embeddings with an affine final norm and vocab < d_model: the logits read the
                final norm only on W_E's rows, so a stream rotation A with γ_final ↦ γ_final + diag M
                (M = [A, D_γ] + diag M symmetric, M·W_Eᵀ = 0; c(c+1)/2 of them under RMSNorm, c =
                d − rank W_E) is flat, also combined with block 0's input offsets; under LayerNorm
                W_E may move by s⊗1 and β_final along ker W_E.""")


def _skew_basis(u: torch.Tensor) -> list[torch.Tensor]:
    """U·(E_ab − E_ba)·Uᵀ for a < b: a basis of so(range U)."""
    m = u.shape[1]
    out = []
    for a in range(m):
        for b in range(a + 1, m):
            out.append(torch.outer(u[:, a], u[:, b]) - torch.outer(u[:, b], u[:, a]))
    return out


# ============================================================================ translations
@dataclass
class Segment:
    """A stretch of residual stream: opened by ``opening`` (a bias / β that adds a constant, or
    a whole embedding table), read by ``readers``, closed by the bias ``closing`` that writes
    into the next stretch.  ``next_ln``: the next stretch is read only through a LayerNorm (a
    constant along 1 may pass).  ``ln``: the affine LayerNorm whose output this stretch is
    (its readers can then absorb any constant through their weights, see :func:`_reader_ones`).
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
    R, count, parts = _Rows(layout), 0, []
    eye = torch.eye(d, dtype=torch.float64)
    for seg in segments:
        if any(name not in p for name, _ in seg.opening):
            continue
        readers = [(w, b if (b is not None and b in p) else None) for w, b in seg.readers if _has(p, w)]
        ln = seg.ln if (seg.ln is not None and f"{seg.ln}.b" in p and f"{seg.ln}.w" in p) else None
        closing = seg.closing if (seg.closing is not None and seg.closing in p) else None

        def absorbs(w, b):
            return b is not None or ln is not None
        v_reader = next(((w, b) for w, b in readers if w.endswith(".W_V")), None)
        with_w = v_reader is not None and absorbs(*v_reader) and closing is None and not seg.final
        M = None
        if v_reader is not None:
            pre = v_reader[0].rsplit(".", 1)[0]
            M = torch.zeros(nkv * e, d, dtype=torch.float64)   # value constant (per KV head) ↦ output
            for h in range(cfg.n_heads):
                j = h // cfg.group_size
                M[j * e:(j + 1) * e] += p[f"{pre}.W_O"][h]
        nw = nkv * e if with_w else 0
        rows = []                                   # constraint rows acting on x = (c, w)
        for w, b in readers:
            wv = _reader_value(p, w).reshape(d, -1)
            if w.endswith(".W_V"):
                continue
            if w.endswith(".W_K") and (absorbs(w, b) or cfg.pos != "rope"):
                continue
            if _is_router(w):
                if ln is not None:
                    continue
                wv = wv - wv.mean(1, keepdim=True)
            elif absorbs(w, b):
                continue
            rows.append(torch.cat([wv.T, torch.zeros(wv.shape[1], nw, dtype=torch.float64)], 1))
        if not seg.final and closing is None:
            # total constant c + v·M must vanish (up to 1 if a LayerNorm reads next)
            tot = torch.cat([eye, M.T if with_w else torch.zeros(d, 0, dtype=torch.float64)], 1)
            if v_reader is not None and not with_w and not absorbs(*v_reader):
                tot[:, :d] += (_reader_value(p, v_reader[0]).reshape(d, -1) @ M).T
            if seg.next_ln:
                one = torch.ones(d, 1, dtype=torch.float64) / d ** 0.5
                tot = (eye - one @ one.T) @ tot
            rows.append(tot)
        cons = torch.cat(rows) if rows else torch.zeros(0, d + nw, dtype=torch.float64)
        basis = _null_rows(cons, d + nw)
        gamma_inv = (1.0 / p[f"{ln}.w"]) if ln is not None else None
        bg = float((p[f"{ln}.b"] / p[f"{ln}.w"]).sum()) if ln is not None else None
        for x in basis:
            c, wfree = x[:d], x[d:]
            v = R.new()
            for name, kind in seg.opening:
                R.at(v, name)[...] = c
            const = c.clone()

            def absorb(w, b, shift):
                if b is not None:
                    R.at(v, b)[...] += shift
                else:   # through the reader's weights: W + γ⁻¹⊗u adds (β·γ⁻¹)·u
                    rv = _reader_rows(R, v, w)
                    rv += gamma_inv.reshape(d, *([1] * shift.dim())) * (shift / bg)
            for w, b in readers:
                rv = _reader_value(p, w)
                shift = torch.einsum("d,d...->...", c, rv)
                if w.endswith(".W_V"):
                    if absorbs(w, b):
                        target = wfree.reshape(nkv, e) if with_w else torch.zeros_like(shift)
                        absorb(w, b, target - shift)
                        const = const + target.reshape(-1) @ M
                    else:
                        const = const + shift.reshape(-1) @ M
                elif w.endswith(".W_K") and b is None and cfg.pos != "rope" and ln is None:
                    continue
                elif _is_router(w) and b is None and ln is None:
                    continue
                elif absorbs(w, b):
                    absorb(w, b, -shift)
            if closing is not None:
                R.at(v, closing)[...] = -const          # (all experts' b_out: the gates sum to 1)
            count += 1
        parts.append(f"{seg.label}: {basis.shape[0]}")
    if not count:
        return None
    return _fam(layout, "stream-translation", "Σ over stream stretches of dim{allowed (c, w)} ("
                + ", ".join(parts) + ")", count, R, translation_family.__doc__)


def _null_rows(m: torch.Tensor, n: int) -> torch.Tensor:
    """Rows: an orthonormal basis of {x ∈ R^n : m·x = 0}."""
    if m.shape[0] == 0:
        return torch.eye(n, dtype=torch.float64)
    _, s, vh = torch.linalg.svd(m, full_matrices=True)
    r = int((s > s[0] * max(m.shape) * 1e-12).sum()) if s.numel() and float(s[0]) > 0 else 0
    return vh[r:].contiguous()


# ============================================================================ post-norm (BERT)
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
    emb_tables = [t for t in ("embed.W_E", "embed.W_pos", "embed.W_tt") if t in p]
    pairs = [("embed.W_E", "embed.W_pos")] + ([("embed.W_tt", "embed.W_pos")] if "embed.W_tt" in p else [])
    embed_ln = cfg.embed_norm and norm in LN
    fams.append(_embed_offset(problem, pairs, ones=embed_ln))

    def ffn_prefix(i):
        return f"blocks.{i}.moe" if cfg.experts else f"blocks.{i}.mlp"

    def attn_readers(i):
        return [(f"blocks.{i}.attn.W_{n}", f"blocks.{i}.attn.b_{n}") for n in "QKV"]

    def mlp_readers(i):
        pre = ffn_prefix(i)
        rs = [(f"{pre}.W_in", f"{pre}.b_in")] + ([(f"{pre}.W_gate", f"{pre}.b_gate")] if cfg.act == "swiglu" else [])
        if cfg.experts:
            rs.append((f"{pre}.W_router", None))
        return rs

    # The norm producing each block's input (None: raw embeddings) and each LN1.
    sources = [("embed.ln" if cfg.embed_norm and norm != "none" else None, attn_readers(0), 0)]
    sources += [(f"blocks.{i - 1}.ln2", attn_readers(i), i) for i in range(1, L)]
    mids = [(f"blocks.{i}.ln1", mlp_readers(i), i) for i in range(L)]

    # ------------------------------------------------------------ writer ones
    if ln:
        R, count = _Rows(layout), 0
        names = list(emb_tables) if embed_ln else []
        for i in range(L):
            names += [n for n in (f"blocks.{i}.attn.W_O", f"blocks.{i}.attn.b_O", f"{ffn_prefix(i)}.W_out",
                                  f"{ffn_prefix(i)}.b_out") if n in p]
        for w in names:
            for r in range(_writer_rows(p[w]).shape[0]):
                _writer_rows(R.at(R.new(), w))[r] = 1.0
                count += 1
        fams.append(_fam(layout, "ln-writer-ones", "rows of every writer into a LayerNorm's input", count, R,
                         """What a LayerNorm reads loses its all-ones component: embedding rows (embedding
                         LN), W_O/b_O rows (LN1), W_out/b_out rows (LN2) may add any multiple of 1."""))

    # ------------------------------------------------------------ segment translations
    segments = []
    for n, rs, i in sources:
        if norm == "none" and i > 0:
            opening = [(f"{ffn_prefix(i - 1)}.b_out", "bias")]    # no norm: the previous closing bias
        else:
            opening = [(f"{n}.b", "bias")] if n is not None else [("embed.W_E", "rows")]
        segments.append(Segment(opening, rs, f"blocks.{i}.attn.b_O", ln, f"attn {i}",
                                ln=n if norm == "layernorm" else None))
    for n, rs, i in mids:
        opening = [(f"blocks.{i}.attn.b_O", "bias")] if norm == "none" else [(f"{n}.b", "bias")]
        segments.append(Segment(opening, rs, f"{ffn_prefix(i)}.b_out", ln, f"ffn {i}",
                                ln=n if norm == "layernorm" else None))
    tr = translation_family(problem, segments)
    if tr is not None:
        fams.append(tr)

    # ------------------------------------------------------------ reader ones
    if ln:
        R, count = _Rows(layout), 0
        for n, rs, _ in sources + mids:
            if n is not None:
                count += _reader_ones(problem, R, n, rs)
        if count:
            fams.append(_fam(layout, "ln-reader-ones", "output width of every reader of a LayerNorm output "
                             "that can absorb a constant", count, R, _reader_ones.__doc__))

    # ------------------------------------------------------------ segment scales (eps-broken)
    if norm != "none":
        R, count = _Rows(layout), 0
        if cfg.embed_norm:
            v = R.new()   # the embedding sum, read only by the embedding norm
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
            fams.append(_fam(layout, "segment-scale", "one per norm output that feeds another norm", count, R,
                             """x ↦ c·x on a residual segment (the producing norm's γ, β ×c, its readers ÷c,
                             the segment's writers ×c; or all embedding tables ×c before the embedding
                             norm) is divided out by the next norm — exactly only when ε = 0.""", kind="exact" if cfg.norm_eps == 0 else "eps-broken"))
    return fams


# ============================================================================ all
def families(problem: Problem, gen: Genericity) -> list[Family]:
    """Every family of the problem's architecture (empty families dropped)."""
    cfg = problem.cfg
    out: list[Family | None] = [qk_family(problem), vo_family(problem), key_bias_family(problem),
                                value_bias_family(problem)]
    if cfg.family == "attn" and cfg.n_layers > 1:
        segs = [Segment([(f"blocks.{i}.attn.b_O", "bias")],
                        [(f"blocks.{i + 1}.attn.W_{n}", f"blocks.{i + 1}.attn.b_{n}") for n in "QKV"],
                        f"blocks.{i + 1}.attn.b_O", False, f"attn {i}→{i + 1}") for i in range(cfg.n_layers - 1)]
        out.append(translation_family(problem, segs))
    if cfg.family != "attn":
        out += [ffn_scaling_family(problem, gen), router_family(problem)]
        if cfg.norm_placement == "pre":
            out += pre_norm_families(problem) + first_block_families(problem)
        else:
            out += post_norm_families(problem)
    out += data_families(problem, gen)
    return [f for f in out if f is not None and f.k > 0]
