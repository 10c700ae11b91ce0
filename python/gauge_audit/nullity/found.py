"""The gauge group found on a model's own forward, not assumed.

1. **Converged nullity.**  Rows of J = ∂logits/∂θ (transformers' float64 forward, or a reference
   family's own; reverse mode per block of sequences, the tokens placed in one random order
   cycle after cycle) are added a block at a time into the triangular factor R of a QR
   factorisation (JᵀJ = RᵀR, so ‖Jv‖ = ‖Rv‖ with R only P × P).  After each block the rank is
   read from the largest relative gap of R's spectrum.  Too few rows leave directions flat that
   are not symmetries, so rows are added until the nullity has not changed over the last P rows
   (and at least 2P rows are in), within a row and time budget; the rows it took are reported,
   and a budget that ends first says so.
2. **Each candidate family tested.**  Its generators G (tangent vectors, orthonormalised) are
   flat where ‖R·Gc‖ is below the spectrum's gap threshold: the flat subalgebra's dimension is
   the number of singular values of R·Q_G below it — the candidate is kept only as far as it is
   flat.  Discrete candidates are applied and the logits compared against κ·λ·√(L·K)·ε.
3. **Completeness.**  The union of the flat subalgebras has a rank; measured nullity minus that
   rank is unexplained, and each unexplained direction is reported with the tensors it moves.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch.func import jacrev

from ..actions.candidates import Family, continuous, discrete
from ..errors import GaugeAuditError
from ..models.derived import MAX_PARAMS_MEASURED, Description, Forward
from ..numeric import statistical_factor, worst_case_tolerance
from ..progress import bar
from ..runtime import eps, generator
from .measure import Layout, Spectrum, null_basis, numerical_rank

SEQ = 6  # tokens per sequence: longer than the small copies' windows and chunks (3)


@dataclass
class FamilyResult:
    name: str
    scope: str
    what: str
    generators: int  # independent generators of the candidate
    flat: int  # dimension of its flat subalgebra
    largest_flat: float  # ‖J·v‖ of the least flat kept direction (absolute)
    smallest_kept_out: float  # ‖J·v‖ of the flattest rejected direction (inf: none)


@dataclass
class DiscreteResult:
    name: str
    scope: str
    what: str
    residual: float  # relative change of the logits, in units of ε
    tolerance: float  # statistical tolerance, in ε
    holds: bool


@dataclass
class Found:
    model: str
    source: str
    parameters: int
    rows: int
    history: list[tuple[int, int]]  # (rows, nullity) after each block
    converged: bool
    nullity: int
    gap: float
    threshold: float
    families: list[FamilyResult]
    discrete: list[DiscreteResult]
    explained: int
    unexplained: list[dict[str, float]] = field(default_factory=list)  # per direction: tensor → share
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # each family with a flat part: (family, its flat subalgebra as coefficient columns, n_gen × flat)
    flat: list[tuple[Family, torch.Tensor]] = field(default_factory=list, repr=False)

    @property
    def agrees(self) -> bool:
        return self.converged and self.explained == self.nullity


def inputs(vocab: int, batch: int, g: torch.Generator, cover: bool, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """``batch`` random sequences; ``cover``: with ``tokens`` (all of them, in a random order, by
    default) each placed once at a random position, as many as fit — so no embedding row is unseen."""
    ids = torch.randint(0, vocab, (batch, SEQ), generator=g)
    if cover:
        flat = ids.reshape(-1)
        want = torch.randperm(vocab, generator=g) if tokens is None else tokens
        k = min(want.numel(), flat.numel())
        flat[torch.randperm(flat.numel(), generator=g)[:k]] = want[:k]
    return ids


def converged_factor(
    model: Forward, layout: Layout, seed: int, budget_s: float, max_factor: float, quiet: bool
) -> tuple[torch.Tensor, list[tuple[int, int]], bool, Spectrum]:
    """R (P × P, upper) over enough rows that the nullity is stable; the (rows, nullity) history."""
    P, V = layout.size, model.vocab
    per_seq = SEQ * V
    batch = max(1, math.ceil(P / 2 / per_seq))  # blocks of about P/2 rows
    # Each block places the next tokens of one random order, so every token occurs once a cycle;
    # a token's embedding row is seen only where it occurs, so the nullity must stay unchanged over
    # a whole cycle as well as over P rows (NeoX at 60 tokens, blocks of 2 sequences: 254 stable
    # over P rows, 240 — the group — over a cycle)
    placed = min(V, batch * SEQ)
    order = torch.randperm(V, generator=generator(seed + 3))
    window = max(P, math.ceil(V / placed) * batch * per_seq)
    g = generator(seed + 1)
    names = layout.names

    def f(params, ids):
        return model.logits(params, ids).reshape(-1)

    jac = jacrev(f)
    R = torch.zeros(0, P, dtype=torch.float64)
    history: list[tuple[int, int]] = []
    rows, blocks, t0 = 0, 0, time.time()
    spec: Spectrum | None = None
    converged = False
    with bar(total=None, desc="Jacobian rows", unit="row", disable=quiet) as pb:
        while True:
            ids = inputs(V, batch, g, cover=True, tokens=order[(torch.arange(placed) + blocks * placed) % V])
            blocks += 1
            try:
                J = jac(model.params, ids)
            except RuntimeError as exc:  # e.g. a custom autograd.Function from outside the model's own source
                line = next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
                raise GaugeAuditError(f"{model.name}: torch.func cannot differentiate its forward: {line}") from None
            block = torch.cat([J[n].reshape(J[n].shape[0], -1) for n in names], dim=1)
            R = torch.linalg.qr(torch.cat([R, block]), mode="r").R[:P]
            rows += block.shape[0]
            pb.update(block.shape[0])
            if rows < P:  # the nullity is at least P − rows: nothing to read yet
                if time.time() - t0 > budget_s:
                    break
                continue
            s = torch.linalg.svdvals(R)
            try:
                spec = numerical_rank(s)
            except GaugeAuditError:
                spec = None
            history.append((rows, -1 if spec is None else spec.nullity))
            if spec is not None and rows >= 2 * P:
                back = [n for r, n in history if r <= rows - window]
                if back and back[-1] == spec.nullity:
                    converged = True
                    break
            if rows >= max_factor * P or time.time() - t0 > budget_s:
                break
    if spec is None:
        raise GaugeAuditError(
            f"{model.name}: no clear gap in the Jacobian's spectrum after {rows:,} rows for {P:,} parameters "
            f"({time.time() - t0:.0f} s of a {budget_s:.0f} s budget)"
        )
    return R, history, converged, spec


def _basis(layout: Layout, fam: Family) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal columns Q spanning the family's generators G (dependent ones dropped), and the
    coefficients of Q's columns: G·coef = Q."""
    G = torch.stack([layout.flatten(t) for t in fam.generators], dim=1)
    if G.numel() == 0:
        return G, G.new_zeros(G.shape[1], 0)
    u, s, vh = torch.linalg.svd(G, full_matrices=False)
    keep = s > 1e-10 * float(s[0]) if s.numel() and float(s[0]) > 0 else torch.zeros(0, dtype=torch.bool)
    return u[:, keep], vh[keep].T / s[keep]


def _left_singular(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The left singular vectors and values of a tall ``a``, descending.  LAPACK's divide and
    conquer can fail to converge on a matrix whose singular values are nearly all equal (the
    directions left over once every flat one is explained: all at rounding level); the same
    vectors then come from the eigendecomposition of aᵀa, whose eigenvalues are the s², the
    vectors a·v/s where s > 0."""
    try:
        u, s, _ = torch.linalg.svd(a, full_matrices=False)
        return u, s
    except torch.linalg.LinAlgError:
        lam, v = torch.linalg.eigh(a.T @ a)
        lam, v = lam.flip(0).clamp(min=0.0), v.flip(1)
        s = lam.sqrt()
        u = a @ v / torch.where(s > 0, s, torch.ones_like(s))
        return u, s


def measure(
    model: Forward,
    desc: Description,
    seed: int = 0,
    budget_s: float = 600.0,
    max_factor: float = 12.0,
    quiet: bool = True,
) -> Found:
    t0 = time.time()
    params = model.params
    layout = Layout.of(params)
    P = layout.size
    if P > MAX_PARAMS_MEASURED:  # a size the small copy does not know to shrink
        big = max(params, key=lambda n: params[n].numel())
        raise GaugeAuditError(
            f"{model.name}: {model.source} has {P:,} parameters, more than the {MAX_PARAMS_MEASURED:,} a dense "
            f"measurement takes (largest: {big}, {tuple(params[big].shape)})"
        )
    R, history, converged, spec = converged_factor(model, layout, seed, budget_s, max_factor, quiet)
    thr = spec.threshold
    results: list[FamilyResult] = []
    flat_dirs = []
    kept: list[tuple[Family, torch.Tensor]] = []
    for fam in continuous(desc, params):
        Q, coef = _basis(layout, fam)
        if Q.shape[1] == 0:
            continue
        _, s, vh = torch.linalg.svd(R @ Q, full_matrices=True)
        s_full = torch.cat([s, torch.zeros(Q.shape[1] - s.numel(), dtype=s.dtype)])
        flat = s_full <= thr
        k = int(flat.sum())
        if k:
            flat_dirs.append(Q @ vh[-k:].T)
            kept.append((fam, coef @ vh[-k:].T))
        results.append(
            FamilyResult(
                fam.name,
                fam.scope,
                fam.what,
                Q.shape[1],
                k,
                float(s_full[flat].max()) if k else 0.0,
                float(s_full[~flat].min()) if (~flat).any() else math.inf,
            )
        )
    explained = 0
    unexplained: list[dict[str, float]] = []
    N = null_basis(R, spec.rank)
    if flat_dirs:
        F = torch.cat(flat_dirs, dim=1)
        u, s = _left_singular(F)
        E = u[:, s > 1e-8 * float(s[0])]
        explained = E.shape[1]
        rest = N - E @ (E.T @ N)
    else:
        rest = N
    if rest.numel():
        u, s = _left_singular(rest)
        for j in range(int((s > 0.5).sum())):
            shares = layout.block_norms(u[:, j])
            unexplained.append({k: v for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v > 0.01})
    found = Found(
        model.name,
        model.source,
        P,
        history[-1][0],
        history,
        converged,
        spec.nullity,
        spec.gap_ratio,
        thr,
        results,
        _discrete(model, desc, seed),
        explained,
        unexplained,
    )
    found.flat = kept
    found.notes += special_point(desc, params)
    found.seconds = time.time() - t0
    return found


def special_point(desc: Description, params: dict[str, torch.Tensor]) -> list[str]:
    """Norm factors all equal (a fresh initialisation's 1) or biases all zero: a point where more
    maps may be flat than at a generic one (a QK-norm with equal weights commutes with every
    rotation of a plane); or a size where they may be (a parallel first block's FFN on a
    vocabulary too small: :meth:`~..models.derived.Description.special_vocabulary`)."""
    norms = {r.norm for r in desc.readers if r.norm} | set(desc.post_norms)
    norms |= {n for h in desc.heads for n in (h.q_norm, h.k_norm) if n}
    out = []
    for n in sorted(norms, key=lambda n: n.module):
        g = n.gamma(params)
        if g is not None and g.numel() > 1 and bool((g == g.reshape(-1)[0]).all()):
            out.append(f"special point: {n.module}'s factors are all {float(g.reshape(-1)[0]):g}")
    biases = [b for h in desc.heads for b in (h.qb, h.kb, h.vb, h.ob) if b]
    biases += [hd.router_bias for hd in desc.hidden if hd.router_bias]
    out += [f"special point: {b} is zero" for b in biases if not bool(params[b].any())]
    table = desc.special_vocabulary(params)
    if table is not None:
        out.append(f"special size: {table.what} the size is taken as generic")
    if out:
        out.append("special point: the group measured here may exceed the one at a generic point")
    return out


def path_length(desc: Description, params: dict) -> int:
    """K: the inner-product lengths along one block — the mixer's and the FFN's stream readers,
    the scores, the attention sum over the sequence, the output projection, the QK-norm's mean, the
    FFN's writer, the norms' means — and the unembedding."""
    d = desc.d_model
    k = 2 * d + SEQ + d + 3 * d
    if desc.heads:
        h = desc.heads[0]
        k += h.head_dim + h.n_heads * h.head_dim + (h.head_dim if h.qk_norm != "none" else 0)
    if desc.latent_heads:  # down to the latents, their norms, up to the heads, the scores, the output
        mh = desc.latent_heads[0]
        k += 2 * max((lt.rank for lt in desc.latents), default=0) + mh.nope + mh.rope + mh.n_heads * mh.v
    if desc.hidden:
        name, axis = desc.hidden[0].writers[0]
        k += params[name].shape[axis]
    return k + max((_opaque_length(op, params) for op in desc.opaque), default=0)


def _opaque_length(op, params: dict) -> int:
    """A mixer without a theory (linear attention): the fan-in of each of its tensors (a depthwise
    convolution's kernel) and its state's accumulation over the sequence — every position adds a
    product into a state as wide as its readers' outputs, read out by the writer."""
    fan_in = sum(
        int(params[n].shape[-1])
        for n in (*op.readers, *op.inner, *([op.writer] if op.writer else []))
        if params[n].dim() >= 2
    )
    width = max((int(params[n].shape[0]) for n in op.readers), default=0)
    return fan_in + SEQ * width


def forward_condition(model: Forward, state: dict, ids: torch.Tensor, y0: torch.Tensor, seed: int) -> float:
    """The logits' relative response, in ε, to one relative rounding of every parameter (each
    entry times 1 ± ε, signs drawn from ``seed``; the largest of three draws): the forward's
    condition number at this point, about 1 at a generic one and larger at a copy moved by a
    badly conditioned element."""
    g = generator(seed + 3)
    e64 = eps(torch.float64)
    worst = 0.0
    with torch.no_grad():
        for _ in range(3):
            moved = {
                n: v * (1 + e64 * (2 * torch.randint(0, 2, v.shape, generator=g) - 1).to(v.dtype))
                for n, v in state.items()
            }
            worst = max(worst, float((model.logits(moved, ids) - y0).norm() / y0.norm()) / e64)
    return worst


def _discrete(model: Forward, desc: Description, seed: int) -> list[DiscreteResult]:
    cands = discrete(desc, model.params)
    state = model.state  # a permutation of experts moves the router's stored buffers too
    if not cands:
        return []
    ids = inputs(model.vocab, 8, generator(seed + 2), cover=True)
    with torch.no_grad():
        y0 = model.logits(state, ids)
    L, K = max(1, desc.n_layers), path_length(desc, model.params)
    # the element is a permutation with signs (κ = 1), exact on the parameters: what it changes is
    # the order of the forward's roundings, which a badly conditioned point (a copy moved by a
    # large element) amplifies — by the forward's own condition number, measured
    kappa = max(1.0, forward_condition(model, state, ids, y0, seed))
    _, factor = statistical_factor(L, K, y0.numel())
    tol = kappa * factor  # in ε
    e64 = eps(torch.float64)
    worst = worst_case_tolerance(kappa, L, K, torch.float64) / e64
    out = []
    for c in cands:
        with torch.no_grad():
            y = model.logits(c.apply(state), ids)
        rel = float((y - y0).norm() / y0.norm()) / e64
        out.append(DiscreteResult(c.name, c.scope, c.what, rel, tol, rel <= worst))
    return out
