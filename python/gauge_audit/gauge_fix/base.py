"""What a gauge-fixing step records, and the small linear-algebra pieces the steps share.

A step imposes a *gauge condition* (a set of equations on the parameters that every orbit of one
symmetry family meets) by applying one group element with an existing action; the canonical form
is therefore g·θ for an explicit g.  Discrete choices that the condition leaves open (a sign, an
order, a phase) are :class:`Decision` s with a margin: how far the deciding quantity is from a tie,
relative to its scale.  A decision whose margin is below the amount by which rounding the input to
its storage precision could move it is *not unique* and is reported, never silently taken.

With a ``reference`` (another model's canonical form), the compact residual freedoms (orthogonal
rotations of a balanced factorisation, signs, phases, permutations) are fixed by aligning to the
reference instead of by a rule: that is what :func:`gauge_audit.gauge_fix.compare` uses, so that
near-ties cannot make two copies of one model look different.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import torch

from ..actions import ACTIONS, Element
from ..actions.blockwise import apply_block, block_of
from ..models.config import Config
from ..runtime import remember_product

# Read-only: a plain dict or parameters read lazily from a checkpoint.
Params = Mapping[str, torch.Tensor]


@dataclass
class Decision:
    """A set of ``n`` discrete choices of one kind (or a degeneracy) met by a step: their smallest
    margin and how many of them are ties."""

    kind: str  # sign | order | phase | spectrum | match
    where: str
    margin: float  # smallest relative distance from a tie over the set (0: an exact tie)
    threshold: float  # rounding the input to its storage precision can move a margin this much
    n: int = 1
    n_ties: int = 0  # choices with margin ≤ threshold: not unique
    # the threshold's factor before u·κ (Context.threshold), and every margin: a model
    # canonicalised one run of blocks at a time judges its runs' decisions again once the whole
    # model's κ is known (:mod:`.by_runs`); None where the decision was merged already
    sensitivity: float | None = field(default=None, compare=False)
    margins: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # one choice for the whole model whose margin is the largest over its parts (a special point
    # that every block must meet): runs of blocks merge it by the largest margin, not the smallest
    joint: bool = field(default=False, compare=False)

    @classmethod
    def of(
        cls, kind: str, where: str, margins, threshold: float, sensitivity: float | None = None, joint: bool = False
    ) -> Decision:
        m = torch.as_tensor(margins, dtype=torch.float64).reshape(-1)
        if joint and m.numel():
            m = m.max().reshape(1)
        if m.numel() == 0:
            return cls(kind, where, 1.0, threshold, 0, 0, sensitivity, m, joint)
        n_ties = int((m <= threshold).sum())
        return cls(kind, where, float(m.min()), threshold, int(m.numel()), n_ties, sensitivity, m, joint)

    @property
    def unique(self) -> bool:
        return self.n_ties == 0

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "where": self.where,
            "min_margin": self.margin,
            "threshold": self.threshold,
            "n": self.n,
            "not_unique": self.n_ties,
        }


@dataclass
class StepRecord:
    """One applied gauge-fixing element."""

    family: str  # the nullity theory's family it fixes (qk-gl, ln-writer-ones, …)
    action: str  # the action that applies the element
    element: Element
    condition: str  # the gauge condition, in words
    decisions: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reads: frozenset = frozenset()  # tensors (besides those it writes) the element's effect depends on
    writes: frozenset = frozenset()  # tensors it changed

    @property
    def ties(self) -> list[Decision]:
        return [d for d in self.decisions if not d.unique]


# Actions whose elements are diagonal scalings (and permutations, κ = 1): they preserve every
# entry's relative rounding error and every |x|·|W| product a rounding bound is made of, so they
# do not amplify the input's rounding — unlike the dense GL / rotation elements.
DIAGONAL = frozenset(
    {
        "norm-scale",
        "qk-norm-scale",
        "latent-norm-scale",
        "relu-scaling",
        "swiglu-scaling",
        "deepseek-swiglu-scaling",
        "head-perm",
        "ffn-perm",
        "expert-perm",
        "mla-head-perm",
        "deepseek-ffn-perm",
        "deepseek-expert-perm",
    }
)


def rounding_kappa(records) -> float:
    """The product of the κ of the dense elements among ``records``: how much a relative rounding
    of the input can be amplified in the result (the diagonal ones do not, see DIAGONAL)."""
    return math.prod(r.element.kappa for r in records if r.action not in DIAGONAL)


# blocks are replaced in this many runs of consecutive blocks: while a step replaces one run, that
# run exists twice (16: a sixteenth of the blocks; SmolLM2's canonicalize peaks at 1.47 GB, against
# 1.58 GB with 4 runs; the arithmetic per block is the same whatever the runs)
SPANS = 16


def span_element(act, cfg: Config, element: Element, lo: int, n: int) -> Element | None:
    """``element`` cut to blocks lo … lo+n−1, renumbered from 0 (``blockwise.restrict`` for a run
    of blocks)."""
    if act.element_layout == "shared":
        return element
    if act.element_layout == "layers":
        return Element({k: t[lo : lo + n] for k, t in element.parts.items()}, element.kappa, element.note)
    parts = {}
    for k, t in element.parts.items():  # "norms": keyed by the norm's name
        b = block_of(k + ".")
        if b is not None and lo <= b < lo + n:
            parts[renumbered(k, b, b - lo)] = t
    return Element(parts, element.kappa, element.note) if parts else None


def renumbered(name: str, i: int, j: int) -> str:
    prefix = f"blocks.{i}."
    return f"blocks.{j}." + name[len(prefix) :] if name.startswith(prefix) else name


def moved(name: str, by: int) -> str:
    """A block parameter's name with its block index shifted by ``by``."""
    b = block_of(name)
    assert b is not None  # only the parameters of a run of blocks are renumbered
    return renumbered(name, b, b + by)


def apply_in_place(cfg: Config, params: dict[str, torch.Tensor], action: str, element: Element) -> frozenset:
    """Apply ``action`` to ``params`` (a dict this caller owns), replacing its tensors one run of
    consecutive blocks at a time (each run as a model of its own depth, with its slice of the
    element, like :func:`~gauge_audit.actions.blockwise.apply_block`; the embeddings and head
    through ``apply_block``), so that only one run exists twice — the whole-model rule would hold
    the old and the new model at once, and single blocks would repeat the element's own
    validation per block.  An action whose element couples blocks (layout "whole") is applied at
    once.  Returns the names of the tensors it replaced."""
    act = ACTIONS[action]
    if act.element_layout == "whole":
        new = act.apply(cfg, params, element)
        replaced = frozenset(k for k in new if new[k] is not params.get(k))
        for k in replaced:
            params[k] = new[k]
        return replaced
    groups: dict[int | None, list[str]] = {}
    for k in params:
        groups.setdefault(block_of(k), []).append(k)
    step = max(1, -(-cfg.n_layers // SPANS))
    runs: list[tuple[int | None, int, list[str]]] = [(None, 0, groups.get(None, []))]
    for first in range(0, cfg.n_layers, step):
        n = min(step, cfg.n_layers - first)
        runs.append((first, n, [k for b in range(first, first + n) for k in groups.get(b, [])]))
    writes: set[str] = set()
    for lo, n, names in runs:
        if lo is None:
            new = apply_block(act, cfg, {k: params[k] for k in names}, element, None)
        else:
            part = span_element(act, cfg, element, lo, n)
            if part is None:
                continue
            sub = {moved(k, -lo): params[k] for k in names}
            new = {moved(k, lo): v for k, v in act.apply(cfg.with_(n_layers=n), sub, part).items()}
            del sub
        for k in names:
            if new[k] is not params[k]:
                params[k] = new[k]
                writes.add(k)
        del new
    return frozenset(writes)


class Context:
    """The state of one canonicalisation: the current parameters (float64; a dict of its own,
    updated in place), the records so far, the reference (or None), the storage unit roundoff u
    of the input and the product κ of the dense elements applied so far (how much the input's
    rounding may have been amplified)."""

    def __init__(
        self,
        cfg: Config,
        params: Params,
        reference: Params | None,
        u: float,
        frozen: dict[str, Element] | None = None,
        whole: bool = False,
    ):
        self.whole = whole  # apply each element with the whole-model rule (a new dict per step)
        self.cfg = cfg
        self.params = params
        self.reference = reference
        self.u = u
        self.kappa = 1.0
        self.records: list[StepRecord] = []
        self.frozen = frozen or {}

    def reuse(self, family: str) -> bool:
        """Apply the element of ``family`` given in ``frozen``, if any: the permutation chosen on
        the unperturbed model (the rounding-response probes of :mod:`.comparison` perturb the input
        by u and measure the continuous response, so the discrete choices stay those of the base
        point — a choice that u could flip is reported there as not unique — and the costly
        matching is not redone), or the stream rotation a probe's first run of blocks computed
        from its embeddings (:mod:`.response`)."""
        el = self.frozen.get(family)
        if el is None:
            return False
        self.apply(family, family, el, "reused (given)")
        return True

    def threshold(self, sensitivity: float) -> float:
        """The margin below which rounding the input could flip a decision whose deciding quantity
        moves by at most ``sensitivity``·(relative input change)."""
        return sensitivity * self.u * self.kappa

    def decision(self, kind: str, where: str, margins, sensitivity: float, joint: bool = False) -> Decision:
        """The decision of ``margins`` at :meth:`threshold` (``sensitivity``); ``joint``: one
        decision, the largest of the margins (:attr:`Decision.joint`)."""
        return Decision.of(kind, where, margins, self.threshold(sensitivity), sensitivity, joint)

    def apply(
        self, family: str, action: str, element: Element, condition: str, decisions=(), notes=(), reads=()
    ) -> None:
        if self.whole:
            before = self.params
            self.params = ACTIONS[action].apply(self.cfg, before, element)
            writes = frozenset(k for k in self.params if self.params[k] is not before.get(k))
        else:
            # not whole: self.params is a dict of its own, updated in place
            writes = apply_in_place(self.cfg, cast("dict[str, torch.Tensor]", self.params), action, element)
        if action not in DIAGONAL:
            self.kappa *= element.kappa
        self.records.append(
            StepRecord(family, action, element, condition, list(decisions), list(notes), frozenset(reads), writes)
        )


# ----------------------------------------------------------------------------- helpers
def ones_basis(d: int) -> torch.Tensor:
    """A fixed orthonormal basis (d × (d−1) columns) of 1^⊥: the Helmert basis, column k ∝
    (1, …, 1, −k, 0, …) with k ones."""
    u = torch.zeros(d, d - 1, dtype=torch.float64)
    for k in range(1, d):
        u[:k, k - 1] = 1.0
        u[k, k - 1] = -float(k)
        u[:, k - 1] /= math.sqrt(k * (k + 1))
    return u


SIGN_SENSITIVITY = 3.0  # a relative change u of every entry moves Σ vᵢ³ by at most 3u·Σ|vᵢ|³


def signs(v: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The canonical sign of each vector along ``dim``: that of Σ vᵢ³ (the third moment; a vector
    and its negative differ there unless it vanishes), with margin |Σ vᵢ³| / Σ |vᵢ|³ ∈ [0, 1]."""
    return signs_of_moments((v**3).sum(dim), (v.abs() ** 3).sum(dim))


def signs_of_moments(cube: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`signs` from the sums Σ vᵢ³ and Σ |vᵢ|³ (taken in pieces over a long vector)."""
    sign = torch.where(cube < 0, -1.0, 1.0).to(torch.float64)
    margin = torch.where(scale > 0, cube.abs() / scale.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    return sign, margin


def descending(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The order sorting ``keys`` (last axis) descending, stable; and the relative gaps between
    consecutive sorted keys (relative to the largest; empty for a single key)."""
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    s = torch.gather(keys, -1, order)
    top = s[..., :1].abs().clamp_min(torch.finfo(torch.float64).tiny)
    return order, (s[..., :-1] - s[..., 1:]) / top


def procrustes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The orthogonal Q minimising ‖a·Q − b‖_F (a, b: n × m, or batches … × n × m)."""
    u, _, vh = torch.linalg.svd(a.transpose(-1, -2) @ b)
    return u @ vh


def match(cost: torch.Tensor) -> tuple[torch.Tensor, float]:
    """An assignment minimising ``cost`` (n × n; row i: item i of this model, column j: item j of
    the reference): returns perm with perm[j] = the row matched to reference item j, and the
    margin: the smallest relative gap, over reference items, between the chosen cost and the next
    best row (0 when the greedy fallback was needed)."""
    n = cost.shape[0]
    best = cost.argmin(0)
    if n == 1:
        return best, 1.0
    if torch.equal(torch.sort(best).values, torch.arange(n)):
        two = torch.topk(cost, 2, dim=0, largest=False).values
        scale = cost.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
        return best, float(((two[1] - two[0]) / scale).min())
    # not one-to-one: greedy over pairs by increasing cost
    perm = torch.full((n,), -1, dtype=torch.long)
    used = torch.zeros(n, dtype=torch.bool)
    for flat in torch.argsort(cost.reshape(-1)).tolist():
        i, j = divmod(flat, n)
        if perm[j] < 0 and not used[i]:
            perm[j] = i
            used[i] = True
    return perm, 0.0


def gram_axes(
    ctx: Context, x: torch.Tensor, ref: torch.Tensor | None, where: str, keep_product: bool = False
) -> tuple[torch.Tensor, list]:
    """The orthogonal Q (e × e) that makes the Gram of x·Q diagonal with descending entries and
    each column x·Q[:, i] of positive third moment — or, with ``ref``, the orthogonal Procrustes
    fit of x to it — and its decisions (eigenvalue gaps and signs, resp. the fit's conditioning).
    Unique when the eigenvalues are distinct and no third moment vanishes.  ``keep_product``: keep
    x·Q, formed here for the third moments, for the step that applies Q
    (:func:`~gauge_audit.runtime.remember_product`)."""
    if ref is not None:
        sv = torch.linalg.svdvals(x.T @ ref)
        fit = float(sv[-1] / sv[0]) if float(sv[0]) > 0 else 0.0
        return procrustes(x, ref), [ctx.decision("match", f"{where} (Procrustes to the reference)", [fit], 2.0)]
    lam, vec = torch.linalg.eigh(x.T @ x)
    lam, vec = lam.flip(0), vec.flip(1)
    y = x @ vec
    s, margin = signs(y, dim=0)
    q = vec * s
    if keep_product:
        remember_product(x, q, y.mul_(s))
    del y
    return q, gram_decisions(ctx.decision, where, lam, float((x * x).sum()), margin)


def gram_decisions(decide, where: str, lam: torch.Tensor, sumsq: float, margin: torch.Tensor) -> list[Decision]:
    """The decisions of :func:`gram_axes` — the Gram's eigenvalue gaps (descending ``lam``; a
    relative change u of every entry of x moves a gap relative to the largest eigenvalue by at most
    2u·‖x‖²_F / λ₁) and the axes' signs (their third-moment ``margin``) — through ``decide(kind,
    where, margins, sensitivity)`` (:meth:`Context.decision`)."""
    top = float(lam[0]) if float(lam[0]) > 0 else 1.0
    return [
        decide("spectrum", f"{where}: Gram eigenvalue gaps", (lam[:-1] - lam[1:]) / top, 2.0 * (sumsq / top)),
        decide("sign", f"{where}: axes", margin, SIGN_SENSITIVITY),
    ]


@dataclass
class Balanced:
    """X·M and Y·M⁻ᵀ balanced: (XM)ᵀ(XM) = (YM⁻ᵀ)ᵀ(YM⁻ᵀ) = Σ = diag(σ) with σ the singular values
    of X·Yᵀ, descending."""

    m: torch.Tensor
    sigma: torch.Tensor
    rank_ok: bool


def balance(x: torch.Tensor, y: torch.Tensor) -> Balanced:
    """The balanced factorisation of the bilinear map X·Yᵀ (X: n × e, Y: p × e, both of rank e):
    X = Q₁R₁, Y = Q₂R₂, R₁R₂ᵀ = UΣVᵀ, M = R₁⁻¹·U·Σ^{1/2}; then X·M = Q₁UΣ^{1/2} and
    Y·M⁻ᵀ = Q₂VΣ^{1/2}.  Unique up to M ↦ M·D·P (D a sign, P a permutation within equal σ)."""
    e = x.shape[1]
    _, r1 = torch.linalg.qr(x)
    _, r2 = torch.linalg.qr(y)
    u, s, _ = torch.linalg.svd(r1 @ r2.T)
    tiny = s.max() * max(x.shape[0], y.shape[0]) * torch.finfo(torch.float64).eps if s.numel() else 0.0
    if s.numel() < e or not bool((s > tiny).all()):
        return Balanced(torch.eye(e, dtype=torch.float64), s, False)
    m = torch.linalg.solve_triangular(r1, u * s.sqrt(), upper=True)
    return Balanced(m, s, True)
