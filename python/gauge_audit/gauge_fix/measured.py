"""Compare two checkpoints of an architecture without a family file through the group measured
on A's own forward.

B is a re-parametrised copy of A when an element g of the measured group maps A to B within B's
rounding.  The element is searched for, under a bound, in this order:

1. **the stream** — stream-gl's element from the embeddings alone (nothing else moves them):
   E_B ≈ E_A·M by least squares, log M projected on the flat subalgebra; the stream reflection
   first when the orientation differs (det M < 0);
2. **the norms** — each norm fold from the ratio of the two norms' factors;
3. **the permutations the forward verified** — the units of every FFN (in every expert) matched
   by their normalised reader rows and writer columns, experts by their units, KV groups by the
   principal angles between their key and value row spaces, the query heads of a KV group by the
   residual of the group's query map (every order, at most ``MAX_ORDERS``); greedy assignments,
   the worst match's cosine reported; then each rotary plane's quarter turns;
4. **every other flat family from its own tensors** — a GL family: the least-squares map of its
   forward side and its logarithm (a map without a real logarithm, det < 0, is applied as the
   matrix itself once the forward confirms it at A); a coordinate scaling: the log-ratio of its
   first entry; a shift: the mean difference — each projected on the family's flat subalgebra;
5. **all flat coefficients polished together** by Levenberg–Marquardt on the per-tensor relative
   residual ‖g·A − B‖/‖B‖, at most ``POLISH`` steps.

Verdicts.  EQUIVALENT: every tensor's residual is within 4·(ε_B/2 + κ(g)·m·ε₆₄) — B's own
rounding plus the float64 rounding of g·A, m the longest inner product of the action.
DIFFERENT: transformers' float64 logits of A and B differ by more than a copy could show — ten
times the largest response of B's logits to simulated roundings of its entries to its storage
dtype, or the float64 rounding of an element of κ ≤ ``KAPPA_MAX`` (κ·L·K·ε₆₄), whichever is
larger.  Otherwise UNDECIDED, saying which step did not close.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch.func import jacfwd

from ..actions.candidates import Discrete, Family, discrete, permute_heads, permute_latent_heads
from ..errors import GaugeAuditError
from ..measured import Measured, action_length, described, held_maps, stored_dtype
from ..models.derived import HFModel, load
from ..nullity.found import measure, path_length
from ..numeric import worst_case_tolerance
from ..runtime import above_rounding, eps, generator, matrix_exp

EQUIVALENT, DIFFERENT, UNDECIDED = "EQUIVALENT", "DIFFERENT", "UNDECIDED"
KAPPA_MAX = 1e6  # DIFFERENT: the float64 rounding of no element of condition number up to this explains it
PROBES, SAFETY = 3, 10.0  # simulated storage roundings of B, and the margin over their largest response
MAX_ORDERS = 720  # query-head orders tried per KV group (6!)
POLISH = 60  # Levenberg–Marquardt steps
BUDGET_S = 120.0

Params = dict[str, torch.Tensor]


@dataclass
class Fit:
    verdict: str
    function_distance: float  # ‖y_B − y_A‖∞ / ‖y_A‖∞, transformers' float64 logits
    function_tolerance: float  # what B's storage rounding and an element's own rounding could explain
    residual: float | None  # the largest per-tensor ‖g·A − B‖/‖B‖ of the element found (None: no search)
    residual_tolerance: float | None
    kappa: float | None  # of the element found
    worst_tensor: str
    matches: dict[str, float] = field(default_factory=dict)  # permutation → its worst cosine
    steps: list[str] = field(default_factory=list)  # what the search did, in order
    seconds: float = 0.0
    why: str = ""
    params: Params | None = field(default=None, repr=False)  # g·A, the element found applied (no search: None)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("params")
        return out


def logm(M: torch.Tensor) -> torch.Tensor:
    """The principal logarithm (eigendecomposition; zeros where M has no real one)."""
    w, V = torch.linalg.eig(M.to(torch.complex128))
    try:
        L = (V @ torch.diag(torch.log(w)) @ torch.linalg.inv(V)).real
    except RuntimeError:
        return torch.zeros_like(M)
    return L if bool(torch.isfinite(L).all()) else torch.zeros_like(M)


def least_squares(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """The minimum-norm X minimising ‖A·X − B‖, through the SVD: the same bits on every run and
    thread count (torch's ``lstsq`` differs in the last bits from call to call)."""
    U, s, Vh = torch.linalg.svd(A, full_matrices=False)
    keep = above_rounding(A, s)
    return Vh[keep].T @ ((U[:, keep].T @ B) / s[keep, None])


def _inputs(model: HFModel) -> torch.Tensor:
    """The fixed token ids both forwards are compared on."""
    return torch.randint(0, model.vocab, (2, 16), generator=generator(0))


def _logits(model: HFModel, p: Params) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(p, _inputs(model))


def _distance(model: HFModel, desc, ya: torch.Tensor, pb: Params, dtype_b: torch.dtype) -> tuple[float, float]:
    """‖y_B − y_A‖∞/‖y_A‖∞, and what a copy B = round(g·A) could show: ``SAFETY`` times the largest
    response of B's logits to ``PROBES`` simulated roundings of its entries to its storage dtype
    (each entry times 1 + u·ε_B/2, u uniform in [−1, 1]), or g·A's own float64 rounding for an
    element of κ ≤ ``KAPPA_MAX`` (κ·L·K·ε₆₄), whichever is larger."""
    yb = _logits(model, pb)
    dist = float((yb - ya).abs().max() / ya.abs().max())
    g, half = generator(PROBES), eps(dtype_b) / 2
    response = 0.0
    for _ in range(PROBES):
        rounded = {n: t * (1 + half * (2 * torch.rand(t.shape, generator=g, dtype=t.dtype) - 1)) for n, t in pb.items()}
        response = max(response, float((_logits(model, rounded) - yb).abs().max() / yb.abs().max()))
    own = worst_case_tolerance(KAPPA_MAX, desc.n_layers, path_length(desc, model.params), torch.float64)
    return dist, max(SAFETY * response, own)


def differs(model: HFModel, desc, pb: Params, dtype_b: torch.dtype) -> Fit | None:
    """DIFFERENT when the logits alone settle it (no element can map A to B), else None."""
    t0 = time.time()
    return _different(*_distance(model, desc, _logits(model, model.state), pb, dtype_b), dtype_b, t0)


def _different(dist: float, f_tol: float, dtype_b: torch.dtype, t0: float) -> Fit | None:
    if not (dist > f_tol and f_tol < 0.5):
        return None
    why = (
        f"the logits differ by {dist:.3g} relative; B's rounding to {str(dtype_b).removeprefix('torch.')} "
        f"and an element of κ ≤ {KAPPA_MAX:g} explain at most {f_tol:.3g}"
    )
    steps = ["no search: the functions differ"]
    return Fit(DIFFERENT, dist, f_tol, None, None, None, "", {}, steps, time.time() - t0, why)


def _is_log(L: torch.Tensor, M: torch.Tensor, rel: float = 1e-6) -> bool:
    return bool(torch.allclose(matrix_exp(L), M, rtol=0, atol=rel * float(M.abs().max())))


def _gl_map(spec: tuple, pa: Params, pb: Params) -> torch.Tensor:
    """A GL family's matrix F with X_B = Fᵀ·X_A on its forward side, by least squares."""
    _, e, tensor, axis, offsets = spec
    xa, xb = block(pa[tensor], axis, offsets, e), block(pb[tensor], axis, offsets, e)
    return least_squares(xa.T, xb.T)


def _matrix(spec: tuple, pa: Params, pb: Params) -> torch.Tensor | None:
    """:func:`_gl_map`, None if singular."""
    F = _gl_map(spec, pa, pb)
    return F if float(torch.linalg.cond(F)) < 1e12 else None


def _preserves(model: HFModel, desc, fam: Family, F: torch.Tensor, ya: torch.Tensor) -> bool:
    """The forward at A is unchanged by ``fam``'s element F, within the check's worst-case
    tolerance at κ(F)."""
    assert fam.by_matrix is not None
    with torch.no_grad():
        y = model.logits(fam.by_matrix(model.state, F), _inputs(model))
    err = float((y - ya).abs().max() / ya.abs().max())
    kappa = float(torch.linalg.cond(F))
    return err <= worst_case_tolerance(kappa, desc.n_layers, path_length(desc, model.params), torch.float64)


def project(basis: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Coordinates z (c ≈ basis·z) of the flat subalgebra's element nearest to c."""
    return least_squares(basis, c[:, None])[:, 0]


def block(t: torch.Tensor, axis: int, offsets: list[int], e: int) -> torch.Tensor:
    return torch.cat([t.narrow(axis, o, e).movedim(axis, 0).reshape(e, -1) for o in offsets], dim=1)


def estimate(fam: Family, pa: Params, pb: Params) -> torch.Tensor | None:
    """Coefficients of ``fam`` mapping ``pa`` towards ``pb``, read off the family's own tensors;
    None for a GL map that exp does not reach (no real logarithm)."""
    n = len(fam.generators)
    spec = fam.spec
    if spec is None:
        return torch.zeros(n, dtype=torch.float64)
    if spec[0] == "gl":  # (kind, e, tensor, axis, offsets): X_B = exp(C)ᵀ·X_A
        M = _gl_map(spec, pa, pb)
        L = logm(M)
        if not _is_log(L, M):
            # a pair of equal real eigenvalues below 0 (a rotation by π): the real logarithm pairs
            # them, which a slight perturbation makes a conjugate pair; the polish ends it
            g = generator(len(fam.generators))
            L = logm(M + 1e-7 * float(M.abs().max()) * torch.randn(M.shape, generator=g, dtype=M.dtype))
        return L.reshape(-1) if _is_log(L, M, 1e-4) else None
    gens = spec[1]  # coordinatewise: per generator its entries (tensor, index, sign, kind)
    out = torch.zeros(n, dtype=torch.float64)
    for j, entries in enumerate(gens):
        tensor, idx, sign, kind = entries[0]
        xa, xb = pa[tensor][idx], pb[tensor][idx]
        if kind == "shift":
            out[j] = sign * float((xb - xa).mean())
            continue
        if kind == "scale1p":
            xa, xb = 1.0 + xa, 1.0 + xb
        ratio = float((xa * xb).sum() / (xa * xa).sum().clamp_min(1e-300))
        out[j] = sign * math.log(ratio) if ratio > 0 else 0.0
    return out


# ----------------------------------------------------------------------------- permutations
def _greedy(S: torch.Tensor) -> tuple[torch.Tensor, float]:
    """π with π[i] the row matched to column i, taking the largest remaining entry each time;
    and the smallest matched value."""
    S = S.clone()
    pi = torch.full((S.shape[1],), -1, dtype=torch.long)
    worst = math.inf
    for _ in range(min(S.shape)):
        k = int(torch.argmax(S))
        r, c = divmod(k, S.shape[1])
        worst = min(worst, float(S[r, c]))
        pi[c] = r
        S[r, :] = -math.inf
        S[:, c] = -math.inf
    return pi, worst


def _unit_signatures(hd, p: Params, f: int, layout: str, expert: int | None) -> torch.Tensor:
    """Per unit: its reader rows and writer column, each normalised (positive scalings drop out)."""
    parts = []
    for n, a in hd.readers + hd.writers:
        if n.endswith("bias"):
            continue
        t = p[n] if expert is None else p[n][expert]
        ax = a if expert is None else a - 1
        w = t.shape[ax]
        for half in range(2 if w == 2 * f else 1):
            cols = torch.arange(f)
            if w == 2 * f:  # the unit's gate (half 0) or up (half 1) column
                cols = half * f + cols if layout == "concat" else 2 * cols + half
            x = t.index_select(ax, cols).movedim(ax, 0).reshape(f, -1)
            parts.append(x / x.norm(dim=1, keepdim=True).clamp_min(1e-300))
    return torch.cat(parts, dim=1) / math.sqrt(len(parts))


def match_units(d: Discrete, hd, pa: Params, pb: Params, layout: str, experts: bool) -> tuple[torch.Tensor, float]:
    f = d.items
    if not experts:
        pi, worst = _greedy(_unit_signatures(hd, pa, f, layout, None) @ _unit_signatures(hd, pb, f, layout, None).T)
        return pi, worst
    E = hd.experts
    sa = [_unit_signatures(hd, pa, f, layout, e) for e in range(E)]
    sb = [_unit_signatures(hd, pb, f, layout, e) for e in range(E)]
    rows, worst = [], math.inf
    for e in range(E):
        pi, w = _greedy(sa[e] @ sb[e].T)
        rows.append(pi)
        worst = min(worst, w)
    return torch.stack(rows), worst


def match_experts(hd, pa: Params, pb: Params, f: int, layout: str) -> tuple[torch.Tensor, float]:
    E = hd.experts
    sa = [_unit_signatures(hd, pa, f, layout, e) for e in range(E)]
    sb = [_unit_signatures(hd, pb, f, layout, e) for e in range(E)]
    S = torch.tensor([[float((sa[a] @ sb[b].T).max(dim=0).values.mean()) for b in range(E)] for a in range(E)])
    return _greedy(S)


def match_kv_groups(h, pa: Params, pb: Params) -> tuple[torch.Tensor, float]:
    """KV groups matched by the row spaces of their keys and values (a GL map of the group's
    coordinates keeps them): the mean cosine of the principal angles, greedy."""

    e = h.head_dim

    def spaces(p: Params) -> list[list[torch.Tensor]]:
        return [
            [torch.linalg.qr(p[w][st[g] : st[g] + e].T).Q for w, st in ((h.k, h.k_starts), (h.v, h.v_starts))]
            for g in range(h.n_kv)
        ]

    def cosine(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return sum(float(torch.linalg.svdvals(x.T @ y).mean()) for x, y in zip(a, b)) / len(a)

    sa, sb = spaces(pa), spaces(pb)
    return _greedy(torch.tensor([[cosine(a, b) for b in sb] for a in sa]))


def match_heads(h, g: int, pa: Params, pb: Params) -> tuple[torch.Tensor, float]:
    """The order of KV group ``g``'s query heads whose query rows B maps best by one shared map
    (every order up to ``MAX_ORDERS``); 1 − the relative residual of that map."""
    e, G = h.head_dim, h.group
    starts = [h.q_starts[g * G + i] for i in range(G)]
    xb = block(pb[h.q], 0, starts, e)
    best, best_res = torch.arange(G), math.inf
    for order in itertools.islice(itertools.permutations(range(G)), MAX_ORDERS):
        pi = torch.tensor(order)
        xa = block(permute_heads(h, g, pa, pi)[h.q], 0, starts, e)
        sol = least_squares(xa.T, xb.T)
        res = float((xa.T @ sol - xb.T).norm() / xb.norm())
        if res < best_res:
            best, best_res = pi, res
    return best, 1.0 - best_res


def match_latent_heads(mh, pa: Params, pb: Params) -> tuple[torch.Tensor, float]:
    """The order of multi-head latent attention's heads whose rotated query rows B maps best by
    one shared map (the rotary part's map is one per layer; every order up to ``MAX_ORDERS``);
    1 − the relative residual of that map."""
    qs, H = mh.nope + mh.rope, mh.n_heads
    starts = [i * qs + mh.nope for i in range(H)]
    xb = block(pb[mh.q], 0, starts, mh.rope)
    best, best_res = torch.arange(H), math.inf
    for order in itertools.islice(itertools.permutations(range(H)), MAX_ORDERS):
        pi = torch.tensor(order)
        xa = block(permute_latent_heads(mh, pa, pi)[mh.q], 0, starts, mh.rope)
        sol = least_squares(xa.T, xb.T)
        res = float((xa.T @ sol - xb.T).norm() / xb.norm())
        if res < best_res:
            best, best_res = pi, res
    return best, 1.0 - best_res


def _estimated(
    model, desc, member: tuple[Family, torch.Tensor], cur: Params, pb: Params, ya, fixed: list, steps: list[str]
) -> tuple[Params, torch.Tensor]:
    """``cur`` moved by the estimate of one flat family's element towards ``pb``, and its
    coefficients in the flat basis.  A GL element that exp does not reach (a determinant < 0, a
    single negative eigenvalue) is applied as the matrix read off the tensors where the forward
    at A confirms it (recorded in ``fixed``; its coefficients 0)."""
    fam, basis = member
    c = estimate(fam, cur, pb)
    if c is None and fam.by_matrix is not None and fam.spec is not None:
        F = _matrix(fam.spec, cur, pb)
        if F is not None and _preserves(model, desc, fam, F, ya):
            fixed.append((fam, F))
            steps.append(f"{fam.name} {fam.scope}: its matrix (outside exp's image), checked on the forward")
            return fam.by_matrix(cur, F), torch.zeros(basis.shape[1], dtype=torch.float64)
    z = project(basis, c if c is not None else torch.zeros(len(fam.generators), dtype=torch.float64))
    steps.append(f"{fam.name} {fam.scope}: estimated")
    return fam.act(cur, basis @ z), z


# ----------------------------------------------------------------------------- the search
def fit(
    model: HFModel,
    desc,
    flat: list[tuple[Family, torch.Tensor]],
    held: list[Discrete],
    pb: Params,
    dtype_b: torch.dtype,
    budget_s: float = BUDGET_S,
    search_always: bool = False,
) -> Fit:
    """The element of A's measured group that maps A closest to B (module docstring).
    ``search_always``: search even when the logits settle DIFFERENT (align: the closest element)."""
    t0 = time.time()
    pa = model.state
    names = list(pa)
    e_b = eps(dtype_b)
    ya = _logits(model, pa)
    dist, f_tol = _distance(model, desc, ya, pb, dtype_b)
    early = _different(dist, f_tol, dtype_b, t0)
    if early is not None and not search_always:
        return early
    steps: list[str] = []
    matches: dict[str, float] = {}

    # the stream first, then the norms: the embeddings and the norm factors hold them alone.  A
    # stream map of determinant < 0 is a reflection times exp(so(d)): the reflection goes first.
    # Then the latents (multi-head latent attention): their down-projections' rows hold them once
    # the stream is in place, and the heads reading them are matched in their coordinates
    first = {i for i, (fam, _) in enumerate(flat) if fam.name in ("stream-gl", "norm-fold", "latent-gl")}
    first_order = sorted(first, key=lambda i: (flat[i][0].name == "latent-gl", i))
    # a GL element that exp does not reach (a determinant < 0, a single negative eigenvalue) is
    # applied as the matrix read off the tensors, once the forward has confirmed it at A
    fixed: list[tuple[Family, torch.Tensor]] = []
    z: dict[int, torch.Tensor] = {}
    cur = pa
    reflect = [d for d in held if d.name == "stream-reflection"]
    stream = [fam for fam, _ in flat if fam.name == "stream-gl"]
    if reflect:
        embed = desc.writers[0]  # the embedding: only stream maps move it
        if stream and stream[0].spec is not None:  # the sign of the stream map's determinant
            flip = float(torch.linalg.det(_gl_map(stream[0].spec, pa, pb))) < 0
        else:  # no continuous stream map: coordinate 0 of the embeddings keeps or changes its sign
            flip = float((pa[embed.param].select(embed.axis, 0) * pb[embed.param].select(embed.axis, 0)).sum()) < 0
        if flip:
            cur = reflect[0].apply(cur)
            steps.append("stream-reflection: the stream's orientation differs")
        else:
            reflect = []
    for i in first_order:  # a latent's reflection goes as its matrix: it commutes with the
        # permutations, after which the chain applies it
        cur, z[i] = _estimated(model, desc, flat[i], cur, pb, ya, fixed, steps)
    # the permutations, on A moved by the stream and the norms
    perms: list[tuple[Discrete, torch.Tensor]] = []
    by_scope = {(hd.name): hd for hd in desc.hidden}
    heads = {f"layer {h.layer}": h for h in desc.heads}
    latent = {f"layer {mh.layer}": mh for mh in desc.latent_heads}
    for d in held:
        if d.permute is None:
            continue
        if d.name == "expert-swap":
            hd = by_scope[d.scope]
            unit = next((u for u in held if u.name == "unit-swap" and u.scope == d.scope), None)
            layout = _layout(unit)
            f = unit.items if unit else pa[hd.writers[0][0]].shape[hd.writers[0][1]]
            pi, worst = match_experts(hd, cur, pb, f, layout)
            perms.append((d, pi))
            cur = _permuted(d, cur, pi)
            matches[f"{d.name} {d.scope}"] = worst
    for d in held:  # KV groups before the heads inside them
        if d.name == "kv-group-swap":
            h = heads[d.scope]
            pi, worst = match_kv_groups(h, cur, pb)
            perms.append((d, pi))
            cur = _permuted(d, cur, pi)
            matches[f"{d.name} {d.scope}"] = worst
    for d in held:
        if d.permute is None or d.name in ("expert-swap", "kv-group-swap"):
            continue
        if d.name == "unit-swap":
            hd = by_scope[d.scope]
            pi, worst = match_units(d, hd, cur, pb, _layout(d), hd.experts > 0)
        elif d.name == "head-swap":
            h = heads[d.scope]
            rows, worst = [], math.inf
            for g in range(h.n_kv):
                row, w = match_heads(h, g, cur, pb)
                rows.append(row)
                worst = min(worst, w)
            pi = torch.stack(rows)
        elif d.name == "latent-head-swap":
            pi, worst = match_latent_heads(latent[d.scope], cur, pb)
        else:
            continue
        perms.append((d, pi))
        cur = _permuted(d, cur, pi)
        matches[f"{d.name} {d.scope}"] = worst
    steps += [f"{d.name} {d.scope}: matched" for d, _ in perms]
    # rotary turns, one plane and KV group at a time: the quarter turns whose q/k rows match B best
    turns: list[tuple[Discrete, int, int, int]] = []
    done: set[tuple[int, str]] = set()
    for d in sorted(held, key=lambda d: d.name != "rotary-quarter-turn"):
        if d.turn is None:
            continue
        h = next(x for x in desc.heads if f"layer {x.layer}" == " ".join(d.scope.split()[:2]))
        if (h.layer, "turn") in done:
            continue
        done.add((h.layer, "turn"))
        options = (0, 1, 2, 3) if d.name == "rotary-quarter-turn" else (0, 2)
        for g in [0] if h.qk_norm == "head" else range(h.n_kv):
            for plane in range(d.items):
                k = min(options, key=partial(_turn_miss, d, h, cur, pb, plane, g))
                if k:
                    cur = _turned(d, cur, plane, g, k)
                    turns.append((d, plane, g, k))
    steps += [
        f"{d.name} {d.scope.split(' KV')[0]} plane {pl} KV group {g}: {k} quarter turn(s)" for d, pl, g, k in turns
    ]
    base = cur  # A moved by the estimated stream and norms, then permuted

    def chain(zs: dict[int, torch.Tensor]) -> Params:
        q = reflect[0].apply(pa) if reflect else pa
        for i, (fam, basis) in enumerate(flat):  # a read-off family where the chain starts
            if fam.read_off:
                q = fam.act(q, basis @ zs[i])
        for i in first_order:
            fam, basis = flat[i]
            q = fam.act(q, basis @ zs[i])
        for d, pi in perms:
            q = _permuted(d, q, pi)
        for d, plane, g, k in turns:
            q = _turned(d, q, plane, g, k)
        for fam, F in fixed:
            assert fam.by_matrix is not None
            q = fam.by_matrix(q, F)
        for i, (fam, basis) in enumerate(flat):
            if i not in first and not fam.read_off:
                q = fam.act(q, basis @ zs[i])
        return q

    cur = base
    for i in range(len(flat)):
        if i not in first:
            cur, z[i] = _estimated(model, desc, flat[i], cur, pb, ya, fixed, steps)
    scale = {n: float(pb[n].norm()) or 1.0 for n in names}
    sizes = [flat[i][1].shape[1] for i in range(len(flat))]

    def unpack(v: torch.Tensor) -> dict[int, torch.Tensor]:
        out, k = {}, 0
        for i, s in enumerate(sizes):
            out[i] = v[k : k + s]
            k += s
        return out

    def resid(v: torch.Tensor) -> torch.Tensor:
        q = chain(unpack(v))
        return torch.cat([((q[n] - pb[n]) / scale[n]).reshape(-1) for n in names])

    v = torch.cat([z[i] for i in range(len(flat))]) if flat else torch.zeros(0, dtype=torch.float64)
    r = resid(v)
    fv, lam, polished = float(r @ r), 1e-6, 0
    while polished < POLISH:
        if not v.numel() or time.time() - t0 > budget_s or fv < 1e-32:
            break
        polished += 1
        J = jacfwd(resid)(v)
        g, H = J.T @ r, J.T @ J
        better = False
        while lam < 1e12:
            step = torch.linalg.solve(H + lam * torch.diag(torch.diag(H) + 1e-30), -g)
            r2 = resid(v + step)
            f2 = float(r2 @ r2)
            if f2 < fv:
                v, r, fv, lam, better = v + step, r2, f2, lam / 4, True
                break
            lam *= 4
        if not better:
            break
    steps.append(f"polished: {polished} Levenberg–Marquardt steps")
    zs = unpack(v)
    moved = chain(zs)
    per = {n: float((moved[n] - pb[n]).norm() / scale[n]) for n in names}
    worst_tensor = max(per, key=per.__getitem__) if per else ""
    kappas: dict[str, float] = {}
    for i, (fam, basis) in enumerate(flat):
        kappas[fam.name] = max(kappas.get(fam.name, 1.0), fam.kappa(basis @ zs[i]))
    for fam, F in fixed:
        kappas[fam.name] = max(kappas.get(fam.name, 1.0), float(torch.linalg.cond(F)))
    kappa = math.prod(kappas.values())
    m_len = action_length(desc)
    r_tol = 4.0 * (e_b / 2 + kappa * m_len * eps(torch.float64))
    res = per.get(worst_tensor, 0.0)
    if early is not None:
        verdict, why = DIFFERENT, early.why
    elif res <= r_tol:
        verdict, why = EQUIVALENT, f"an element of the measured group (κ {kappa:.3g}) maps A to B within rounding"
    else:
        verdict, why = (
            UNDECIDED,
            (
                f"no element found ({worst_tensor}: residual {res:.3g} > {r_tol:.3g}) and the logits differ by "
                f"only {dist:.3g} (≤ {f_tol:.3g}): a map the search does not try, or a search that did not "
                "converge within its budget"
            ),
        )
    return Fit(verdict, dist, f_tol, res, r_tol, kappa, worst_tensor, matches, steps, time.time() - t0, why, moved)


def _permuted(d: Discrete, p: Params, pi: torch.Tensor) -> Params:
    assert d.permute is not None
    return d.permute(p, pi)


def _turned(d: Discrete, p: Params, plane: int, g: int, k: int) -> Params:
    assert d.turn is not None
    return d.turn(p, plane, g, k)


def _turn_miss(d: Discrete, h, p: Params, pb: Params, plane: int, g: int, k: int) -> float:
    q = _turned(d, p, plane, g, k)
    return sum(float((q[n] - pb[n]).norm()) for n in (h.q, h.k))


def _layout(unit: Discrete | None) -> str:
    if unit is None:
        return "single"
    if "interleaved" in unit.what:
        return "interleaved"
    return "concat" if "gate | up" in unit.what else "single"


def compare_checkpoints(a, b, seed: int = 0, budget_s: float = BUDGET_S) -> tuple[Fit, dict]:
    """The logits first (no group is measured for models whose functions differ), then the group
    measured on A's own forward and :func:`fit`; the report as JSON."""
    a, b = Path(a), Path(b)
    model, desc = described(a, seed, "compare")
    mb = load(b, seed)
    if mb.name != model.name:
        raise GaugeAuditError(f"different architectures: {model.name} vs {mb.name}")
    if mb.source != model.source:
        raise GaugeAuditError(f"{b}: compare needs the checkpoint's own weights (at most as large as A)")
    same_shapes(model.state, mb.state)
    dtype_b = stored_dtype(b)
    group: dict = {}
    r = differs(model, desc, mb.state, dtype_b)
    if r is None:
        m = Measured(model, desc, measure(model, desc, seed, quiet=True))
        group = {"nullity": m.found.nullity, "explained": m.found.explained, "converged": m.found.converged}
        held = held_maps(m, discrete(desc, model.params))
        r = fit(model, desc, m.found.flat, held, mb.state, dtype_b, budget_s)
    report = {"a": str(a), "b": str(b), "architecture": model.name, "derived": True, "group": group, **r.to_json()}
    return r, report


def same_shapes(pa: Params, pb: Params) -> None:
    if set(pa) != set(pb):
        extra = sorted(set(pa) ^ set(pb))
        raise GaugeAuditError(f"different architectures: tensor {extra[0]} is in one model only")
    for n in pa:
        if pa[n].shape != pb[n].shape:
            raise GaugeAuditError(f"different architectures: {n} is {tuple(pa[n].shape)} vs {tuple(pb[n].shape)}")
