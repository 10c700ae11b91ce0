"""The canonical form of a checkpoint without a family file, through the group measured on its own
forward.

The measured group is a Lie algebra of flat directions (each family's ``act`` its flow) and the
discrete maps that held.  One representative of the orbit, in four stages, each equivariant under
what the later ones fix:

1. **norm folds** — every norm factor folded into its readers (γ ↦ ±1, a ``1+w`` norm's w ↦ 0),
   where the fold is flat in every coordinate.  Afterwards a stream rotation reads R itself, not
   Γ⁻¹RΓ: the action is orthogonal on every tensor;
2. **smallest norm** — the element of the identity component minimising ‖g·θ‖² (the sum of
   squares of every entry) over the flat directions other than rotations, by damped Newton in the
   group's own coordinates (recentred each step, at most ``STEPS`` steps).  By Kempf and Ness the
   minimum of a closed orbit is unique up to the compact part K: what is left is rotations;
3. **the compact part** — per GL family, K = flat ∩ so(e).  Where K is so(S) on blocks S of
   coordinates (the whole of so(e); so(2) per rotary plane and so of the pass-through block), each
   block's rotation diagonalises the Gram matrix of the family's forward side, eigenvalues falling,
   the stream's first (every other side is read in stream coordinates).  Every axis is signed by
   the sum of the cubes of its coordinates, the block's last one only where a reflection of the
   block is a symmetry (the stream's when its reflection held; any other family's when the
   forward confirms it), else by det = +1.  Without a stream rotation, a held stream reflection
   signs coordinate 0 by the cubes of its embedding entries;
4. **the discrete maps that held** — experts, FFN units, KV groups and query heads sorted by their
   sums of squares, falling; each rotary plane's quarter turns by the sum of cubes of its first
   coordinate.

What is not fixed is named (a compact part that is not so of coordinate blocks, a unit's negative
scaling), and so is every decision whose margin is below rounding.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.func import grad, hessian, jacfwd

from ..actions.candidates import Discrete, Family, discrete, signed_permutation
from ..measured import (
    action_length,
    certificate_inputs,
    function_change,
    held_maps,
    measured,
    stored_dtype,
    tolerances,
    write_moved,
)
from ..models.checkpoint.writer import refuse_existing
from ..models.derived import Description, HFModel
from ..runtime import above_rounding, eps, matrix_exp, reproducible
from .measured import block, least_squares, logm, project

STEPS = 60  # Gauss–Newton steps of the smallest norm
BUDGET_S = 120.0

Params = dict[str, torch.Tensor]


@dataclass
class Canonical:
    params: Params
    conditions: dict[str, int]  # family → the dimensions its conditions fix
    kappa: float  # of the canonicalising element
    steps: list[str]
    not_fixed: list[str]
    margins: dict[str, float]  # per kind of decision: its smallest margin (relative)
    gradient: float  # ‖∇‖g·θ‖²‖ / ‖θ‖² at the end of stage 2 (0 at the exact minimum)
    seconds: float
    length: int  # m, the longest inner product of the action: its float64 rounding is κ·m·ε per entry
    decisions_below_rounding: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("params")
        return out


class _Kappa:
    """The canonicalising element's condition number, per family: coordinate families add their
    coefficients (their scalings commute), GL families multiply their matrices."""

    def __init__(self) -> None:
        self.coeffs: dict[int, torch.Tensor] = {}
        self.mats: dict[int, torch.Tensor] = {}

    def add(self, i: int, fam: Family, c: torch.Tensor) -> None:
        if fam.spec is not None and fam.spec[0] == "gl":
            e = fam.spec[1]
            self.matrix(i, matrix_exp(c.reshape(e, e).to(torch.float64)))
        else:
            self.coeffs[i] = self.coeffs.get(i, torch.zeros_like(c)) + c

    def matrix(self, i: int, F: torch.Tensor) -> None:
        self.mats[i] = self.mats[i] @ F if i in self.mats else F

    def value(self, flat: list[tuple[Family, torch.Tensor]]) -> float:
        per: dict[str, float] = {}
        for i, c in self.coeffs.items():
            fam = flat[i][0]
            per[fam.name] = max(per.get(fam.name, 1.0), fam.kappa(c))
        for i, F in self.mats.items():
            name = flat[i][0].name
            per[name] = max(per.get(name, 1.0), float(torch.linalg.cond(F)))
        return math.prod(per.values())


# ----------------------------------------------------------------------------- stage 1
def _fold_norms(flat, cur: Params, kap: _Kappa, steps: list[str], conditions: dict[str, int]) -> tuple[Params, set]:
    """Each fully flat norm fold takes the coefficients that bring its factor to ±1."""
    done = set()
    for i, (fam, basis) in enumerate(flat):
        if fam.name != "norm-fold" or fam.spec is None or basis.shape[1] < len(fam.generators):
            continue
        c = torch.zeros(len(fam.generators), dtype=torch.float64)
        for j, entries in enumerate(fam.spec[1]):
            tensor, idx, sign, kind = entries[0]  # the norm's own entry comes first
            x = float(cur[tensor][idx]) + (1.0 if kind == "scale1p" else 0.0)
            c[j] = -sign * math.log(abs(x)) if x != 0 else 0.0
        c = basis @ project(basis, c)
        cur = fam.act(cur, c)
        kap.add(i, fam, c)
        conditions[fam.name] = conditions.get(fam.name, 0) + basis.shape[1]
        done.add(i)
    if done:
        steps.append(f"norm-fold: {len(done)} norm(s) folded into their readers")
    return cur, done


def _closed_form(flat, cur: Params, kap: _Kappa, steps: list[str], line: str, coefficients) -> tuple[Params, set]:
    """Each family for which ``coefficients(i, family, cur)`` gives coefficients (None: not this
    stage's) taken there at once, in order; ``line``: the step's report, ``{}`` the count."""
    done = set()
    for i, (fam, _) in enumerate(flat):
        c = coefficients(i, fam, cur)
        if c is None:
            continue
        cur = fam.act(cur, c)
        kap.add(i, fam, c)
        done.add(i)
    if done:
        steps.append(line.format(len(done)))
    return cur, done


def _own_representatives(flat, bases: dict, cur: Params, kap: _Kappa, steps: list[str]) -> tuple[Params, set]:
    """Families that name their own representative (``Family.canonical``: a LayerNorm's shift taken
    back along its readers' ones directions, whose orbit may hold several minima of the norm) taken
    there in closed form, where their whole candidate is flat; the Newton steps leave them out."""

    def named(i: int, fam, cur: Params) -> torch.Tensor | None:
        basis = bases.get(i)
        if fam.canonical is None or basis is None or basis.shape[1] != len(fam.generators):
            return None
        return fam.canonical(cur)

    line = "representatives: {} famil(ies) at the representative they name (closed form)"
    return _closed_form(flat, cur, kap, steps, line, named)


def _affine_shifts(flat, bases: dict, cur: Params, kap: _Kappa, steps: list[str]) -> tuple[Params, set]:
    """The LayerNorm ones families (every entry a shift: constant tangents) at their smallest norm
    in closed form — least squares over their flat directions — before the Newton steps.  Then no
    direction of the stream's scaling of 1, which trades a writer's 1-component against a reader's,
    is left to drift: both components are 0."""

    def smallest(i: int, fam, cur: Params) -> torch.Tensor | None:
        basis = bases.get(i)
        if not fam.name.startswith("ln-") or fam.spec is None or basis is None or not basis.shape[1]:
            return None
        if any(kind != "shift" for entries in fam.spec[1] for _, _, _, kind in entries):
            return None
        names = sorted({n for gen in fam.generators for n in gen})
        T = torch.stack(
            [
                torch.cat([gen[n].reshape(-1) if n in gen else cur[n].new_zeros(cur[n].numel()) for n in names])
                for gen in fam.generators
            ],
            1,
        )
        theta = torch.cat([cur[n].reshape(-1) for n in names])
        return basis @ least_squares(T @ basis, -theta[:, None])[:, 0]

    line = "shifts: {} LayerNorm ones famil(ies) at their smallest norm (least squares)"
    return _closed_form(flat, cur, kap, steps, line, smallest)


def _acting(chain, cur: Params, n: int) -> torch.Tensor:
    """An orthonormal basis of the coordinates that move the parameters at ``cur`` (the others
    act trivially there: a scaling of a component that is 0 — no step may drift along them)."""
    J = jacfwd(lambda v: chain(v, cur))(torch.zeros(n, dtype=torch.float64))
    _, s, Vh = torch.linalg.svd(J, full_matrices=False)
    return Vh[above_rounding(J, s)].T


# ----------------------------------------------------------------------------- stage 2
def _newton_terms(chain, cur: Params, zero: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    """‖r‖², its gradient and its Hessian at v = 0, r(v) = chain(v, cur)."""

    def f(v: torch.Tensor) -> torch.Tensor:
        r = chain(v, cur)
        return r @ r

    return float(f(zero)), grad(f)(zero), hessian(f)(zero)


def _smallest_norm(flat, bases: dict, cur: Params, kap: _Kappa, steps: list[str], t0: float, budget_s: float):
    """Damped Newton on ‖g(v)·θ‖² over every moved entry, v the coordinates of ``bases`` (family
    index → the flat directions other than rotations), recentred each step.  Returns the point and
    ‖∇‖/‖θ‖² (the moment map, 0 at the minimum)."""
    idx = sorted(bases, key=lambda i: (not flat[i][0].read_off, i))  # a read-off family at the chain's start
    moved = sorted({n for i in idx for gen in flat[i][0].generators for n in gen})
    if not idx:
        return cur, 0.0
    sizes = [bases[i].shape[1] for i in idx]
    within: torch.Tensor | None = None  # v = within·w: only directions that act (below)

    def chain(v: torch.Tensor, p: Params) -> torch.Tensor:
        v = v if within is None else within @ v
        k = 0
        for i, s in zip(idx, sizes):
            p = flat[i][0].act(p, bases[i] @ v[k : k + s])
            k += s
        return torch.cat([p[n].reshape(-1) for n in moved])

    def apply(v: torch.Tensor, p: Params) -> Params:
        v = v if within is None else within @ v
        k = 0
        for i, s in zip(idx, sizes):
            c = bases[i] @ v[k : k + s]
            p = flat[i][0].act(p, c)
            kap.add(i, flat[i][0], c)
            k += s
        return p

    n = sum(sizes)
    acting = _acting(chain, cur, n)
    if acting.shape[1] < n:  # a direction that moves nothing here would let the steps drift along it
        steps.append(f"smallest norm: {n - acting.shape[1]} flat direction(s) act trivially here and are left out")
        within, n = acting, acting.shape[1]
    grad_rel, taken, lam, before = math.inf, 0, 1e-9, math.inf
    slack = 1 + 16 * eps(torch.float64)  # f is quadratic at the minimum: near it, rounding decides f's change
    while taken < STEPS and time.time() - t0 < budget_s:
        zero = torch.zeros(n, dtype=torch.float64)
        f, g, H = _newton_terms(chain, cur, zero)
        grad_rel = float(g.norm()) / f
        # converged, or stalled at rounding (the gradient no longer halves once it is small)
        if grad_rel < 1e-15 or (grad_rel < 1e-9 and grad_rel > before / 2):
            break
        before, better = grad_rel, False
        while lam < 1e12:
            # rotations are not among the coordinates: near the minimum H is positive definite
            step = torch.linalg.solve(H + lam * torch.diag(torch.diag(H).abs() + 1e-300), -g)
            r2 = chain(step, cur)
            if float(r2 @ r2) <= f * slack:
                cur, lam, better = apply(step, cur), max(lam / 4, 1e-12), True
                break
            lam *= 4
        if not better:
            break
        taken += 1
    steps.append(f"smallest norm: {taken} Newton step(s) over {n} flat dimensions, |∇|/|θ|² = {grad_rel:.2e}")
    return cur, grad_rel


# ----------------------------------------------------------------------------- the compact part
@dataclass
class _Block:
    """so(W) for a subspace W of the span of coordinates S: the rotations of W that fix W⊥."""

    coords: list[int]
    basis: torch.Tensor  # |S| × w, orthonormal, spanning W (in S's coordinates)
    target: torch.Tensor  # |S| × w: the frame W's canonical axes are written in (Gram–Schmidt of P_W·e_j)


@dataclass
class _Compact:
    """A GL family's flat algebra split into its rotations K = flat ∩ so(e) and the rest."""

    blocks: list[_Block] | None  # K = ⊕ so(W); None: K is not of that form
    dim: int  # dim K
    rest: torch.Tensor  # coefficient vectors (columns) of flat ⊖ K: what the smallest norm moves along


def _span(cols: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of the span of ``cols``' columns."""
    U, s, _ = torch.linalg.svd(cols, full_matrices=False)
    return U[:, s > 1e-8 * float(s.max() if s.numel() else 0.0)]


def _frame(W: torch.Tensor) -> torch.Tensor:
    """Gram–Schmidt of the projections of e_1, e_2, … on W: a frame of W that depends on W alone."""
    P = W @ W.T
    out: list[torch.Tensor] = []
    for j in range(P.shape[0]):
        v = P[:, j].clone()
        for u in out:
            v = v - (u @ v) * u
        if float(v.norm()) > 1e-8:
            out.append(v / v.norm())
        if len(out) == W.shape[1]:
            break
    return torch.stack(out, dim=1)


def _compact(fam: Family, basis: torch.Tensor) -> _Compact:
    assert fam.spec is not None
    e = fam.spec[1]
    q = torch.linalg.qr(basis).Q  # orthonormal: the z-inner product is the Frobenius one
    mats = q.T.reshape(-1, e, e)
    S = (mats + mats.transpose(1, 2)).reshape(mats.shape[0], -1).T  # z ↦ sym(Σ z_k C_k)
    _, s, vh = torch.linalg.svd(S, full_matrices=True)
    rank = int((s > 1e-8).sum())  # a skew element's symmetric part is rounding; any other's is O(1)
    null, rest = vh[rank:].T, vh[:rank].T
    if null.shape[1] == 0:
        return _Compact([], 0, q)
    K = torch.einsum("kz,kab->zab", null, mats)
    link = (K.abs() > 1e-8 * float(K.abs().max())).any(0)
    parent = list(range(e))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in link.nonzero().tolist():
        parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for a in range(e):
        groups.setdefault(root(a), []).append(a)
    blocks: list[_Block] | None = []
    total = 0
    for coords in (g for g in groups.values() if len(g) > 1):
        ix = torch.tensor(coords)
        sub = K[:, ix][:, :, ix]  # K on this block of coordinates
        W = _span(sub.transpose(0, 1).reshape(len(coords), -1))  # every element's range
        w, dim = W.shape[1], _span(sub.reshape(sub.shape[0], -1).T).shape[1]
        total += dim
        if dim != w * (w - 1) // 2 and blocks is not None:
            blocks = None  # K here is not all of so(W)
        elif blocks is not None:
            blocks.append(_Block(coords, W, _frame(W)))
    if blocks is not None and total != null.shape[1]:
        blocks = None
    return _Compact(blocks, null.shape[1], q @ rest)


def _rotation(
    G: torch.Tensor, X: torch.Tensor, blocks: list[_Block], free: Callable[[_Block], bool], margins: dict
) -> torch.Tensor:
    """F = ⊕ F_S, F_S = (I − P_W) + V·Tᵀ: W's eigenvectors V of the Gram G (eigenvalues falling)
    onto the frame T, W⊥ kept; each axis signed by the sum of the cubes of its row of Fᵀ·X — the
    last one too where ``free(S)`` (a reflection of W is a symmetry), else by det F_S = +1."""
    e = G.shape[0]
    F = torch.eye(e, dtype=torch.float64)
    for blk in blocks:
        ix, B, T = torch.tensor(blk.coords), blk.basis, blk.target
        w, U = torch.linalg.eigh(B.T @ G[ix][:, ix] @ B)
        w, V = w.flip(0), B @ U.flip(1)
        scale = float(w.abs().max()) or 1.0
        gaps = (w[:-1] - w[1:]).abs() / scale
        margins["eigenvalue gap"] = min(margins.get("eigenvalue gap", math.inf), float(gaps.min()))
        Y = V.T @ X[ix]
        cubes = (Y**3).sum(1)
        ref = (Y.abs() ** 3).sum(1).clamp_min(1e-300)
        reflect = free(blk)
        for a in range(V.shape[1] if reflect else V.shape[1] - 1):
            margins["axis sign"] = min(margins.get("axis sign", math.inf), float(cubes[a].abs() / ref[a]))
            if cubes[a] < 0:
                V[:, a] = -V[:, a]
        FS = torch.eye(len(blk.coords), dtype=torch.float64) - B @ B.T + V @ T.T
        if not reflect and float(torch.linalg.det(FS)) < 0:
            V[:, -1] = -V[:, -1]
            FS = torch.eye(len(blk.coords), dtype=torch.float64) - B @ B.T + V @ T.T
        F[ix[:, None], ix[None, :]] = FS
    return F


def _fix_compact(
    desc: Description,
    flat,
    compact: dict,
    held: list[Discrete],
    cur: Params,
    kap: _Kappa,
    steps,
    not_fixed,
    margins,
    conditions,
    holds: Callable[[Params, Params], bool],
) -> Params:
    reflect = next((d for d in held if d.name == "stream-reflection"), None)
    rotated = any(flat[i][0].name == "stream-gl" and compact[i].blocks for i in compact)
    if reflect is not None and not rotated:
        # no stream rotation to carry it: coordinate 0's sign from the cubes of its embedding entries
        embed = desc.writers[0]
        x0 = cur[embed.param].select(embed.axis, 0)
        cubes = float((x0**3).sum())
        margins["axis sign"] = min(margins.get("axis sign", math.inf), abs(cubes) / float((x0.abs() ** 3).sum()))
        if cubes < 0:
            cur = reflect.apply(cur)
        conditions["stream-reflection"] = 1
    # the stream first: every other family's forward side is read in stream coordinates
    for i in sorted(compact, key=lambda i: flat[i][0].name != "stream-gl"):
        fam = flat[i][0]
        blocks, dim = compact[i].blocks, compact[i].dim
        if blocks is None:
            not_fixed.append(f"{fam.name} {fam.scope}: its rotations are not so(S) of coordinate blocks")
            continue
        if not blocks:
            continue
        _, e, tensor, axis, offsets = fam.spec
        X = block(cur[tensor], axis, offsets, e)
        stream = fam.name == "stream-gl"

        def free(blk: _Block, fam: Family = fam, e: int = e, at: Params = cur) -> bool:
            """A reflection of W is a symmetry: the stream's when its reflection held (coordinate 0,
            W the whole stream), any other family's when the forward is unchanged by one (det < 0:
            outside exp's image)."""
            if fam.name == "stream-gl" or fam.by_matrix is None:
                return fam.name == "stream-gl" and reflect is not None and blk.basis.shape[1] == e
            u = torch.zeros(e, dtype=torch.float64)
            u[torch.tensor(blk.coords)] = blk.basis[:, 0]
            R = torch.eye(e, dtype=torch.float64) - 2 * torch.outer(u, u)
            return holds(at, fam.by_matrix(at, R))

        F = _rotation(X @ X.T, X, blocks, free, margins)
        if stream and reflect is not None and float(torch.linalg.det(F)) < 0:
            cur = reflect.apply(cur)  # coordinate 0 negated: F's first row with it, into SO(d)
            F = F.clone()
            F[0] = -F[0]
            steps.append("stream-reflection: the stream's canonical axes are left-handed")
        if fam.by_matrix is not None:
            cur = fam.by_matrix(cur, F)
            kap.matrix(i, F)
        else:
            C = logm(F)
            if not torch.allclose(matrix_exp(C), F, rtol=0, atol=1e-10):
                not_fixed.append(f"{fam.name} {fam.scope}: its canonical rotation has no real logarithm")
                continue
            cur = fam.act(cur, C.reshape(-1))
            kap.add(i, fam, C.reshape(-1))
        conditions[fam.name] = conditions.get(fam.name, 0) + dim
    steps.append("compact parts: every GL family's rotations diagonalise its forward side's Gram matrix")
    return cur


# ----------------------------------------------------------------------------- stage 4
def _sorted(keys: torch.Tensor, margins: dict, what: str) -> torch.Tensor:
    """π putting the largest key first; the smallest relative gap between neighbours as margin."""
    order = torch.argsort(keys, descending=True, stable=True)
    k = keys[order]
    if k.numel() > 1:
        gap = float(((k[:-1] - k[1:]) / k.abs().max().clamp_min(1e-300)).min())
        margins[what] = min(margins.get(what, math.inf), gap)
    return order


def _permuted(d: Discrete, p: Params, pi: torch.Tensor) -> Params:
    assert d.permute is not None
    return d.permute(p, pi)


def _sumsq(t: torch.Tensor, axis: int) -> torch.Tensor:
    return (t.movedim(axis, 0).reshape(t.shape[axis], -1) ** 2).sum(1)


def _fix_discrete(desc: Description, held: list[Discrete], cur: Params, steps, margins, conditions) -> Params:
    hidden = {hd.name: hd for hd in desc.hidden}
    heads = {f"layer {h.layer}": h for h in desc.heads}
    by = {name: [d for d in held if d.name == name] for name in ("expert-swap", "unit-swap", "kv-group-swap")}
    for d in by["expert-swap"]:
        hd = hidden[d.scope]
        sizes = torch.stack([_sumsq(cur[n], 0) for n, _ in hd.readers + hd.writers]).sum(0)
        cur = _permuted(d, cur, _sorted(sizes, margins, "expert order"))
        conditions["expert-swap"] = conditions.get("expert-swap", 0) + 1
    for d in by["unit-swap"]:
        hd = hidden[d.scope]
        name, axis = hd.writers[0]
        t = cur[name]
        if hd.experts:
            pi = torch.stack([_sorted(_sumsq(t[e], axis - 1), margins, "unit order") for e in range(hd.experts)])
        else:
            pi = _sorted(_sumsq(t, axis), margins, "unit order")
        cur = _permuted(d, cur, pi)
        conditions["unit-swap"] = conditions.get("unit-swap", 0) + 1
    for d in by["kv-group-swap"]:
        h = heads[d.scope]
        e = h.head_dim
        keys = torch.stack(
            [
                (cur[h.k][h.k_starts[g] : h.k_starts[g] + e] ** 2).sum()
                + (cur[h.v][h.v_starts[g] : h.v_starts[g] + e] ** 2).sum()
                for g in range(h.n_kv)
            ]
        )
        cur = _permuted(d, cur, _sorted(keys, margins, "KV group order"))
        conditions["kv-group-swap"] = conditions.get("kv-group-swap", 0) + 1
    for d in held:
        if d.name != "head-swap":
            continue
        h = heads[d.scope]
        e, orders = h.head_dim, []
        for g in range(h.n_kv):
            sums = []
            for head in range(g * h.group, (g + 1) * h.group):
                q0 = h.q_starts[head]
                sums.append((cur[h.q][q0 : q0 + e] ** 2).sum() + (cur[h.o][:, head * e : (head + 1) * e] ** 2).sum())
            orders.append(_sorted(torch.stack(sums), margins, "head order"))
        cur = _permuted(d, cur, torch.stack(orders))
        conditions["head-swap"] = conditions.get("head-swap", 0) + 1
    latent = {f"layer {mh.layer}": mh for mh in desc.latent_heads}
    for d in held:
        if d.name != "latent-head-swap":
            continue
        mh = latent[d.scope]
        qs, v = mh.nope + mh.rope, mh.v
        sums = [
            (cur[mh.q][i * qs : (i + 1) * qs] ** 2).sum() + (cur[mh.o][:, i * v : (i + 1) * v] ** 2).sum()
            for i in range(mh.n_heads)
        ]
        cur = _permuted(d, cur, _sorted(torch.stack(sums), margins, "head order"))
        conditions[d.name] = conditions.get(d.name, 0) + 1
    cur = _fix_turns(desc, held, cur, margins, conditions)
    if held:
        steps.append("discrete: " + ", ".join(sorted({d.name for d in held})))
    return cur


def _first_cubes(d: Discrete, h, p: Params, plane: int, g: int, k: int) -> float:
    """Σ x³ over the plane's first coordinate in the q and k rows of group g, after k quarter turns."""
    assert d.turn is not None
    q = d.turn(p, plane, g, k)
    a = plane if "half-split" in d.what else 2 * plane
    groups = range(h.n_kv) if h.qk_norm == "head" else [g]
    total = 0.0
    for gg in groups:
        for hd in range(gg * h.group, (gg + 1) * h.group):
            total += float((q[h.q][h.q_starts[hd] + a] ** 3).sum())
        total += float((q[h.k][h.k_starts[gg] + a] ** 3).sum())
    return total


def _fix_coordinates(h, cur: Params, margins) -> Params:
    """A layer whose quarter turns hold in both plane pairings: the rotations among signed
    permutations of the turned coordinates (the first ``rotary`` of a head: what those turns
    generate) fixed per KV group — sorted by their sums of squares over the query and key rows,
    each signed by the sum of cubes of its query entries, the last by det = +1."""
    e, n = h.head_dim, h.rotary
    for g in [0] if h.qk_norm == "head" else range(h.n_kv):
        groups = range(h.n_kv) if h.qk_norm == "head" else [g]
        q = torch.cat([cur[h.q][h.q_starts[hd] : h.q_starts[hd] + e] for gg in groups
                       for hd in range(gg * h.group, (gg + 1) * h.group)], dim=1)  # fmt: skip
        k = torch.cat([cur[h.k][h.k_starts[gg] : h.k_starts[gg] + e] for gg in groups], dim=1)
        head = _sorted((q[:n] ** 2).sum(1) + (k[:n] ** 2).sum(1), margins, "head coordinate order")
        cubes = (q[head] ** 3).sum(1)
        ref = (q[head].abs() ** 3).sum(1).clamp_min(1e-300)
        margins["axis sign"] = min(margins.get("axis sign", math.inf), float((cubes.abs() / ref)[:-1].min()))
        signs = torch.ones(e, dtype=torch.float64)
        signs[:n] = torch.where(cubes < 0, -1.0, 1.0).to(torch.float64)
        P = torch.zeros(n, n, dtype=torch.float64)
        P[torch.arange(n), head] = signs[:n]
        if float(torch.linalg.det(P)) < 0:
            signs[n - 1] = -signs[n - 1]
        perm = torch.cat([head, torch.arange(n, e)])  # the coordinates the turns leave alone stay
        cur = signed_permutation(h, cur, perm, signs, g)
    return cur


def _fix_turns(desc: Description, held: list[Discrete], cur: Params, margins, conditions) -> Params:
    """Per layer, plane and KV group: of the turns that held (quarter, or half only), the one whose
    first coordinate has the largest sum of cubes."""
    done: set[int] = set()
    for d in sorted(held, key=lambda d: d.name != "rotary-quarter-turn"):
        if d.turn is None:
            continue
        h = next(x for x in desc.heads if f"layer {x.layer}" == " ".join(d.scope.split()[:2]))
        if h.layer in done:
            continue
        done.add(h.layer)
        layouts = {x.what.split("(")[-1] for x in held if x.name == "rotary-quarter-turn" and x.scope == d.scope}
        if len(layouts) > 1 and h.rotary >= 4:  # two pairings of ≥ 2 planes turn: no rotary position here
            cur = _fix_coordinates(h, cur, margins)
            conditions["head-coordinates"] = conditions.get("head-coordinates", 0) + 1
            continue
        options = (0, 1, 2, 3) if d.name == "rotary-quarter-turn" else (0, 2)
        for g in [0] if h.qk_norm == "head" else range(h.n_kv):
            for plane in range(d.items):
                score = {k: _first_cubes(d, h, cur, plane, g, k) for k in options}
                best = max(options, key=score.__getitem__)
                rest = [abs(score[best] - s) for k, s in score.items() if k != best]
                ref = max(abs(s) for s in score.values()) or 1.0
                margins["rotary turn"] = min(margins.get("rotary turn", math.inf), min(rest) / ref)
                cur = d.turn(cur, plane, g, best)
                conditions[d.name] = conditions.get(d.name, 0) + 1
    return cur


# ----------------------------------------------------------------------------- all four
def canonical_form(
    model: HFModel,
    desc: Description,
    flat: list[tuple[Family, torch.Tensor]],
    held: list[Discrete],
    budget_s: float = BUDGET_S,
) -> Canonical:
    t0 = time.time()
    kap = _Kappa()
    steps: list[str] = []
    not_fixed: list[str] = []
    margins: dict[str, float] = {}
    conditions: dict[str, int] = {}
    cur, folded = _fold_norms(flat, model.state, kap, steps, conditions)
    compact = {i: _compact(fam, b) for i, (fam, b) in enumerate(flat) if fam.spec and fam.spec[0] == "gl"}
    bases = {i: compact[i].rest if i in compact else b for i, (_, b) in enumerate(flat) if i not in folded}
    # where both sides of the stream are blind to 1 — a ones shift for every writer and every
    # reader — the ones go first, in closed form; the stream's scale of 1 then acts trivially
    cur, named = _own_representatives(flat, bases, cur, kap, steps)
    if sum(fam.name == "ln-reader-ones" for fam, _ in flat) == len(desc.readers):
        # a start, not the end: where the shifts touch one tensor together (a reader's bias taking
        # back both its ones shift and a β shift; a tied embedding, writer and reader), one family
        # at a time is not their joint minimum, so the steps below move them too
        cur, _ = _affine_shifts(flat, {i: b for i, b in bases.items() if i not in named}, cur, kap, steps)
    newton = {i: b for i, b in bases.items() if b.shape[1] and i not in named}
    cur, grad = _smallest_norm(flat, newton, cur, kap, steps, t0, budget_s)
    for i, b in bases.items():  # the smallest norm fixes all but the rotations
        conditions[flat[i][0].name] = conditions.get(flat[i][0].name, 0) + b.shape[1]
    ids = certificate_inputs(model.vocab)
    tol = tolerances(desc, model.params, 1.0, ids.numel() * model.vocab, torch.float64)[0]

    def holds(p: Params, q: Params) -> bool:
        """q computes p's function within the float64 rounding of an orthogonal map."""
        with torch.no_grad():
            y, y2 = model.logits(p, ids), model.logits(q, ids)
        return float((y2 - y).abs().max() / y.abs().max()) <= tol

    cur = _fix_compact(desc, flat, compact, held, cur, kap, steps, not_fixed, margins, conditions, holds)
    cur = _fix_discrete(desc, held, cur, steps, margins, conditions)
    if grad > 1e-9:  # the budget ended first: the point is not the minimum, so not one per orbit
        not_fixed.append(f"the smallest norm stopped at |∇|/|θ|² = {grad:.2e} (budget): not canonical")
    if any(fam.name == "ffn-scale" for fam, _ in flat):
        not_fixed.append("ffn-scale: negative scalings of a unit (outside exp's image) are not quotiented")
    m_len = action_length(desc)
    kappa = kap.value(flat)
    floor = kappa * m_len * eps(torch.float64)
    below = [k for k, v in margins.items() if v <= floor]
    return Canonical(cur, conditions, kappa, steps, not_fixed, margins, grad, time.time() - t0, m_len, below)


# ----------------------------------------------------------------------------- a checkpoint directory
def canonicalize_checkpoint(
    path: Path,
    out: Path | None,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    budget_s: float = BUDGET_S,
    say: Callable[[str], None] = lambda line: None,
) -> tuple[Canonical, dict]:
    """Measure the group on the checkpoint's own forward, bring it to its canonical form, check the
    function (transformers' float64 logits against κ·L·K·ε) and, with ``out``, write it and its
    certificate.  Returns the canonical form and the report (JSON)."""
    if out is not None:
        refuse_existing(out)
    with reproducible():  # a small model: one thread, so the report does not depend on the thread count
        return _canonicalize(path, out, seed, dtype, budget_s, say)


def _canonicalize(path, out, seed, dtype, budget_s, say) -> tuple[Canonical, dict]:
    say(f"canonicalize: measuring the group of {path} on transformers' own forward ...")
    m = measured(path, seed, 600.0, quiet=True, what="canonicalize")
    held = held_maps(m, discrete(m.desc, m.model.params))
    say("canonicalize: the canonical form ...")
    c = canonical_form(m.model, m.desc, m.found.flat, held, budget_s)
    gap = m.found.nullity - m.found.explained
    if gap > 0:
        c.not_fixed.append(f"{gap} measured flat direction(s) no candidate family explains: not quotiented")
    if not m.found.converged:
        c.not_fixed.append("the nullity had not converged when the measurement's budget ended")
    ids = certificate_inputs(m.model.vocab)
    with torch.no_grad():
        before = m.model.logits(m.model.state, ids)
        after = m.model.logits(c.params, ids)
    report = {
        "checkpoint": str(path),
        "architecture": m.model.name,
        "derived": True,
        "group": {"nullity": m.found.nullity, "explained": m.found.explained, "converged": m.found.converged},
        **c.to_json(),
        "function": function_change(m, after, before, c.kappa, torch.float64),
    }
    if out is not None:
        about = {"action": "canonical form", "families": sorted(c.conditions)}
        wdtype = dtype or stored_dtype(path)
        report["certificate"] = write_moved(m, path, c.params, c.kappa, out, wdtype, about, seed, say)
        (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return c, report


def format_report(report: dict) -> str:
    f = report["function"]
    total = sum(report["conditions"].values())
    parts = ", ".join(f"{k} {v}" for k, v in report["conditions"].items())
    lines = [
        f"{report['checkpoint']}: {report['architecture']} (derived), the group measured on its own forward: "
        f"nullity {report['group']['nullity']}, explained {report['group']['explained']}; "
        f"canonicalised in {report['seconds']:.2f} s",
        f"gauge conditions imposed: {total} ({parts})",
        *(f"  {s}" for s in report["steps"]),
        f"element g: κ = {report['kappa']:.4g}",
        f"same function: {f['verdict']} (max rel. change {f['residual_eps']:.3g} ε; statistical tolerance "
        f"{f['tolerance_statistical_eps']:.4g} ε, worst case {f['tolerance_eps']:.4g} ε)",
        "smallest decision margins: " + ", ".join(f"{k} {v:.2e}" for k, v in report["margins"].items()),
        f"decisions below rounding: {', '.join(report['decisions_below_rounding']) or 'none'}",
        *(f"not fixed: {n}" for n in report["not_fixed"]),
    ]
    cert = report.get("certificate")
    if cert:
        lines.append(
            f"certificate: transformers' float64 logits of the written checkpoint change by "
            f"{cert['residual_eps']:.3g} ε({cert['dtype']}); statistical tolerance "
            f"{cert['tolerance_statistical_eps']:.4g} ε, worst case {cert['tolerance_eps']:.4g} ε: {cert['verdict']}"
        )
    return "\n".join(lines)
