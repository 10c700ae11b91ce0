"""Is B a gauge-transformed copy of A?  ``compare`` canonicalises both and measures what is left.

* ``raw_distance`` — ‖θ_B − θ_A‖_F / ‖θ_A‖_F over all parameters;
* ``invariant_distance`` — the same between the canonical forms; B is canonicalised with A's
  canonical form as reference, so the compact residual freedoms (signs, phases, orthogonal
  rotations inside degenerate spectra, permutations among near-equal keys) are aligned instead of
  decided by rules that rounding could flip;
* per tensor group (embeddings, attention score side, attention output side, norms, FFN, router,
  unembedding): both distances and a tolerance.

**Tolerance.**  A stored copy differs from the exact g·A by the rounding of its storage dtype:
every entry by a relative ≤ u (u = ε/2 of float32, bfloat16, …).  What that does to the
canonical form is its linear response J·δ, which depends on the element's κ (rounding in B's frame
is amplified by κ when mapped back) and on how well conditioned each gauge condition is (spectral
gaps).  It is measured, not guessed: ``probes`` independent simulated roundings δ = u·|θ|⊙z
(z uniform in [−1, 1], seeded) of each model are canonicalised (with the same reference, and the
permutations of the unperturbed model: the probes measure the continuous response, and a discrete
choice that u could flip is reported as not unique instead), and per group σ is the largest response
seen.  Then

    tol_group = λ·√(σ_A² + σ_B²),   λ = √(2·ln(2·G/δ)),  δ = 10⁻⁶, G groups compared,

the Gaussian-tail factor of :mod:`gauge_audit.numeric` (statistical condition estimation in the
sense of Kenney & Laub: rounding errors enter linearly, so their effect is estimated by sampling
the same linear map).  EQUIVALENT when every group (and the whole) is within its tolerance.

**Element.**  For EQUIVALENT the element mapping A to B is g_B⁻¹·g_A (A's canonicalising steps, then
B's undone in reverse), shortened: an element of B's chain is merged into A's element of the same
action when every step between them commutes with it (disjoint tensors); its κ is the product over
what is left.  It is a composite element (:mod:`gauge_audit.actions.composite`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from ..actions import ACTIONS, Element, composite
from ..actions.algebra import compose, inverse
from ..actions.blockwise import apply_block, block_of
from ..errors import GaugeAuditError
from ..models.config import Config, same_architecture
from ..models.families import param_shapes
from ..runtime import Forked, one_thread, release_freed_memory
from .base import Params, StepRecord, apply_in_place
from .pipeline import Canonical, canonicalize_owned, storage_dtype_of, validate
from .response import blockwise, grouped, probe_params, sq_by_group, sq_distance
from .streamed import SharedRuns, b_runs, canonical_b_by_runs, helper_b_runs, response_by_runs

FAILURE_PROBABILITY = 1e-6
EQUIVALENT, DIFFERENT, UNDECIDED = "EQUIVALENT", "DIFFERENT", "UNDECIDED"
# A group whose relative tolerance reaches this cannot vouch for EQUIVALENT: two independent
# generic models are about √2 apart (relative) in every group — 0.4 to 1.5 in the tests — so a
# tolerance of half that would call unrelated models equal.  Such a group is undecided, and so is the
# verdict unless another group is DIFFERENT.  (bfloat16 storage stays below: ≤ 0.19 on the tiny models.)
VOUCH_LIMIT = 0.5

GROUPS = ("embeddings", "attention.qk", "attention.vo", "norms", "ffn", "router", "unembedding")
_sq_by_group = sq_by_group


def relative_distances(a: Params, b: Params, den: dict[str, float] | None = None) -> tuple[float, dict[str, float]]:
    """‖b − a‖_F / ‖a‖_F overall and per tensor group (``den``: Σ‖a‖² per group, if known)."""
    return relative(_sq_by_group(b, a), _sq_by_group(a) if den is None else den)


def relative(num: dict[str, float], den: dict[str, float]) -> tuple[float, dict[str, float]]:
    per = {g: math.sqrt(num[g] / den[g]) if den[g] > 0 else math.sqrt(num[g]) for g in den}
    return math.sqrt(sum(num.values()) / sum(den.values())), per


# ----------------------------------------------------------------------------- tolerance
def _float64(params: Params) -> dict[str, torch.Tensor]:
    """A dict of its own with the parameters in float64 (for the in-place pipeline)."""
    return {k: v.detach().to("cpu", torch.float64) for k, v in params.items()}


def rounding_response(
    cfg: Config, params: Params, canonical: Canonical, reference: Params, probes: int, seed: int
) -> dict[str, float]:
    """Per group, the largest ‖canon(θ + δ) − canon(θ)‖² over ``probes`` simulated roundings δ of θ
    at its storage precision (squared norms, like :func:`sq_by_group`).

    Each probe reuses every discrete decision of the unperturbed run (``canonical``: its
    permutations; the signs, phases and rotations of the compact freedoms are aligned to
    ``reference`` by continuous fits, which a rounding moves continuously) and recomputes only
    the continuous elements: the norm scales, the stream rotation, the balanced factors and unit
    scales.  The one probe loop of :mod:`.response`: one run of blocks at a time where no
    bias-chain stretch joins blocks (no float64 copy of the whole model, the same arithmetic), else
    one run of every block — the whole perturbed model in place (its input finite by construction,
    not validated again)."""
    u = torch.finfo(canonical.storage_dtype).eps / 2
    runs = None if blockwise(cfg, params) else [(0, cfg.n_layers)]  # a stretch joins blocks: one run of all
    return response_by_runs(cfg, params, canonical, reference, probes, seed, u, runs)


def rounding_response_recanonicalised(
    cfg: Config, params: Params, canonical: Canonical, reference: Params, probes: int, seed: int
) -> dict[str, float]:
    """The same probes as :func:`rounding_response` through the public :func:`canonicalize`
    (validation, a float64 copy of the input, each step with the whole-model rule, permutations
    reused): the plain definition of the response, kept to check the fast path against
    (``tests/test_gauge_fix.py``, ``benchmarks/bench_gauge_fix.py``)."""
    u = torch.finfo(canonical.storage_dtype).eps / 2
    worst: dict[str, float] = {}
    for p in range(probes):
        probe = probe_params(params, u, seed, p)
        validate(cfg, probe)
        c = canonicalize_owned(
            cfg, probe, reference=reference, storage_dtype=canonical.storage_dtype, frozen=canonical, whole=True
        )
        for k, v in _sq_by_group(c.params, canonical.params).items():
            worst[k] = max(worst.get(k, 0.0), v)
    return worst


# ----------------------------------------------------------------------------- element
def _touches(r: StepRecord) -> frozenset:
    return r.reads | r.writes


def _commute(a: StepRecord, b: StepRecord) -> bool:
    return not (a.writes & _touches(b)) and not (b.writes & _touches(a))


def element_a_to_b(ca: Canonical, cb: Canonical) -> tuple[Element, int]:
    """g_B⁻¹·g_A as a composite element, shortened; also the number of steps before shortening."""
    chain = list(ca.records) + [
        StepRecord(r.family, r.action, inverse(r.action, r.element), r.condition, reads=r.reads, writes=r.writes)
        for r in reversed(cb.records)
    ]
    n0 = len(chain)
    merged = True
    while merged:
        merged = False
        for j in range(len(chain)):
            for i in range(j - 1, -1, -1):
                if chain[i].action == chain[j].action:
                    first, second = chain[i], chain[j]
                    el = compose(first.action, first.element, second.element)
                    chain[i] = StepRecord(
                        first.family,
                        first.action,
                        el,
                        first.condition,
                        reads=first.reads | second.reads,
                        writes=first.writes | second.writes,
                    )
                    del chain[j]
                    merged = True
                    break
                if not _commute(chain[i], chain[j]):
                    break
            if merged:
                break
    return composite.make([(r.action, r.element) for r in chain]), n0


def element_residual(cfg: Config, params_a: Params, params_b: Params, el: Element, parallel: bool = False) -> float:
    """‖g·A − B‖_F / ‖B‖_F for a composite g (= ACTIONS["composite"].apply), one block at a time
    (every step applied to block i's float64 copy, then compared with B's block and dropped) unless
    a step's element couples blocks (layout "whole"): then the whole float64 g·A, in place.
    ``parallel``: the last blocks (half the parameters) in a forked helper; the squared distances
    are added in parameter order either way, so the value is the same to the last bit."""
    steps = composite.steps(el)
    if any(ACTIONS[action].element_layout == "whole" for action, _ in steps):
        mapped = _float64(params_a)
        for action, step in steps:
            apply_in_place(cfg, mapped, action, step)
        return relative_distances(params_b, mapped)[0]
    blocks: dict[int | None, list[str]] = {}
    for k in params_a:
        blocks.setdefault(block_of(k), []).append(k)
    runs = list(blocks.items())
    split = len(runs)
    if parallel:  # the helper takes blocks from the last down until it holds half the parameters
        # sizes from the family's shapes: a checkpoint's tensors are read on access
        size = {k: math.prod(shape) for k, (shape, _) in param_shapes(cfg).items()}
        total, tail = sum(size[k] for k in params_a), 0
        while split > 1 and 2 * tail < total:
            split -= 1
            tail += sum(size[k] for k in runs[split][1])
    helper = Forked(block_terms, cfg, params_a, params_b, steps, runs[split:], fork=True) if split < len(runs) else None
    try:
        terms = block_terms(cfg, params_a, params_b, steps, runs[:split])
        if helper is not None:
            terms += helper.result()
    finally:
        if helper is not None:
            helper.cancel()
    num = den = 0.0
    for n, d in terms:
        num += n
        den += d
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def block_terms(
    cfg: Config, params_a: Params, params_b: Params, steps: list, runs: list[tuple[int | None, list[str]]]
) -> list[tuple[float, float]]:
    """(‖(g·A)_k − B_k‖², ‖B_k‖²) for every parameter k of the blocks ``runs``, in their order, on
    one thread (the same sums in either process; a forked child must not use the parent's pool)."""
    out = []
    with one_thread():
        for b, names in runs:
            sub: Params = {k: params_a[k].detach().to("cpu", torch.float64) for k in names}
            for action, step in steps:
                sub = apply_block(ACTIONS[action], cfg, sub, step, b)
            for k in names:
                vb = params_b[k]
                out.append((sq_distance(vb, sub[k]), sq_distance(vb)))
            del sub
    return out


# ----------------------------------------------------------------------------- compare
@dataclass
class Comparison:
    verdict: str
    raw_distance: float
    invariant_distance: float
    tolerance: float
    groups: dict[str, dict]
    storage_dtype_a: str
    storage_dtype_b: str
    probes: int
    lam: float
    kappa: float | None = None  # κ of the element mapping A to B (EQUIVALENT)
    element_steps: int | None = None
    element_residual: float | None = None  # ‖g·A − B‖_F / ‖B‖_F
    element: Element | None = None
    canonical_a: Canonical | None = field(default=None, repr=False)
    canonical_b: Canonical | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("element", "canonical_a", "canonical_b")
        }
        out["not_unique_a"] = self.canonical_a.ties() if self.canonical_a else []
        out["not_unique_b"] = self.canonical_b.ties() if self.canonical_b else []
        out["unfixed"] = [{"family": f, "reason": r} for f, r in (self.canonical_a.unfixed if self.canonical_a else [])]
        return out


def judge(
    den: dict[str, float],
    invariant: tuple[float, dict[str, float]],
    raw: tuple[float, dict[str, float]],
    resp_a: dict[str, float],
    resp_b: dict[str, float],
    probes: int,
    ca: Canonical,
    cb: Canonical,
) -> Comparison:
    """The verdict from the distances (overall and per group: ``den`` Σ‖canon A‖² per group, the
    invariant and raw relative distances) and both models' rounding responses (module docstring)."""
    inv, inv_groups = invariant
    lam = math.sqrt(2.0 * math.log(2.0 * (len(den) + 1) / FAILURE_PROBABILITY))
    groups, ok, undecided = {}, True, False
    for gname in den:
        scale = den[gname] if den[gname] > 0 else 1.0
        tol = lam * math.sqrt((resp_a.get(gname, 0.0) + resp_b.get(gname, 0.0)) / scale)
        within = inv_groups[gname] <= tol
        ok = ok and within
        undecided = undecided or (within and tol >= VOUCH_LIMIT)
        groups[gname] = {
            "raw_distance": raw[1][gname],
            "invariant_distance": inv_groups[gname],
            "tolerance": tol,
            "ratio": inv_groups[gname] / tol if tol > 0 else math.inf,
            "undecided": within and tol >= VOUCH_LIMIT,
        }
    tol_all = lam * math.sqrt((sum(resp_a.values()) + sum(resp_b.values())) / sum(den.values()))
    ok = ok and inv <= tol_all
    return Comparison(
        DIFFERENT if not ok else UNDECIDED if undecided else EQUIVALENT,
        raw[0],
        inv,
        tol_all,
        groups,
        str(ca.storage_dtype).replace("torch.", ""),
        str(cb.storage_dtype).replace("torch.", ""),
        probes,
        lam,
        canonical_a=ca,
        canonical_b=cb,
    )


def with_element_found(out: Comparison, residual: Callable[[Element], float]) -> None:
    """For EQUIVALENT, the element mapping A to B (module docstring) into ``out``, with its κ, its
    steps and ``residual(element)``: ‖g·A − B‖_F / ‖B‖_F as the comparison can afford to map A."""
    if out.verdict != EQUIVALENT:
        return
    assert out.canonical_a is not None and out.canonical_b is not None
    el, _ = element_a_to_b(out.canonical_a, out.canonical_b)
    out.element, out.kappa, out.element_steps = el, el.kappa, len(composite.steps(el))
    release_freed_memory()  # the runs' temporaries, before A is mapped once more
    out.element_residual = residual(el)


@dataclass
class Prepared:
    """A's side of a comparison, computed once for many B: its canonical form and its rounding
    response (see :func:`prepare`)."""

    cfg: Config
    params: Params
    canonical: Canonical
    response: dict[str, float]


def prepare(
    cfg: Config, params: Params, *, probes: int = 3, seed: int = 0, storage_dtype: torch.dtype | None = None
) -> Prepared:
    """Canonicalise model A and measure its rounding response, for :func:`compare`.
    ``storage_dtype``: the precision A was stored in (default: the coarsest dtype of ``params``;
    a checkpoint read into float64 passes its file's dtype)."""
    ca = _canonical_a(cfg, params, probes, storage_dtype)
    return Prepared(cfg, params, ca, _response_one_thread(cfg, params, ca, probes, seed))


def _canonical_a(cfg: Config, params: Params, probes: int, storage_dtype: torch.dtype | None) -> Canonical:
    validate(cfg, params)
    if probes < 1:
        raise GaugeAuditError("probes must be >= 1")
    with one_thread():
        return canonicalize_owned(
            cfg, _float64(params), reference=None, storage_dtype=storage_dtype or storage_dtype_of(params)
        )


def _response_one_thread(cfg: Config, params: Params, ca: Canonical, probes: int, seed: int) -> dict[str, float]:
    with one_thread():
        return rounding_response(cfg, params, ca, ca.params, probes, seed)


def _raw_side(params_a: Params, params_b: Params) -> tuple[float, dict[str, float]]:
    """The raw distance (both models read once more), for a helper process while A is canonicalised."""
    with one_thread():
        return relative_distances(params_a, params_b)


def _a_side(
    cfg: Config,
    params_a: Params,
    params_b: Params,
    ca: Canonical,
    probes: int,
    seed: int,
    share: SharedRuns | None = None,
    storage_b: torch.dtype | None = None,
) -> tuple[dict[str, float], dict | None]:
    """What needs A's canonical form but nothing of B's: A's rounding response, for a helper process
    while B is canonicalised; then (``share``) B's runs not taken yet, from the last down."""
    with one_thread():
        response = _response_one_thread(cfg, params_a, ca, probes, seed)
        if share is None or not share.active:
            return response, None
        assert storage_b is not None
        return response, helper_b_runs(share, cfg, params_b, ca, storage_b, probes, seed + 1)


class _Once:
    """A helper's result, fetched once for the callers that need it."""

    def __init__(self, job: Forked):
        self._job, self._done, self._value = job, False, None

    def __call__(self):
        if not self._done:
            self._value, self._done = self._job.result(), True
        return self._value


def compare(
    cfg_a: Config,
    params_a: Params,
    cfg_b: Config,
    params_b: Params,
    *,
    probes: int = 3,
    seed: int = 0,
    with_element: bool = True,
    prepared: Prepared | None = None,
    storage_dtype_a: torch.dtype | None = None,
    storage_dtype_b: torch.dtype | None = None,
    parallel: bool = False,
) -> Comparison:
    """Compare two models of the same architecture up to the whole symmetry group (see the module
    docstring).  Parameters may be in any floating dtype: that dtype is their storage precision,
    unless ``storage_dtype_a`` / ``storage_dtype_b`` say otherwise (checkpoints read into float64).
    ``prepared``: A's side from :func:`prepare` (same A, reused).  ``parallel``: the raw distance
    in a forked helper while A is canonicalised, then A's rounding probes in another while this one
    canonicalises B, that helper taking B's last runs of blocks once its probes are done (two cores:
    the probes are most of the work); the same report (each probe's draws are seeded per tensor,
    the squared responses summed per tensor in parameter order)."""
    same_architecture(cfg_a, cfg_b)
    validate(cfg_b, params_b)
    with one_thread():
        if prepared is None:
            # the raw distance needs neither canonical form: a first helper while A is canonicalised
            raw = Forked(_raw_side, params_a, params_b, fork=parallel)
            ca = _canonical_a(cfg_a, params_a, probes, storage_dtype_a)
            release_freed_memory()  # A's temporaries: neither process needs them before its first run
            # forked once A's canonical form exists (the probes are measured against it); the
            # helper shares its pages copy-on-write and only reads them, then takes B's last runs
            share = None
            if parallel and blockwise(cfg_b, params_b):
                share = SharedRuns(len(b_runs(cfg_b, params_b)))
            storage_b = (storage_dtype_b or storage_dtype_of(params_b)) if share is not None else None
            job = Forked(_a_side, cfg_a, params_a, params_b, ca, probes, seed, share, storage_b, fork=parallel)
            if share is not None and not job.forked:
                share.active = False
            try:
                return _compare(
                    Prepared(cfg_a, params_a, ca, {}),
                    params_b,
                    probes,
                    seed,
                    with_element,
                    storage_dtype_b,
                    _Once(job),
                    share,
                    _Once(raw),
                    parallel,
                )
            finally:  # after an error here, no helper is left waiting to send what nobody reads
                job.cancel()
                raw.cancel()
        if prepared.params is not params_a:
            raise GaugeAuditError("prepared is for another model A")
        return _compare(prepared, params_b, probes, seed, with_element, storage_dtype_b)


def _compare(
    prep: Prepared,
    params_b: Params,
    probes: int,
    seed: int,
    with_element: bool,
    storage_dtype_b: torch.dtype | None = None,
    a_side: _Once | None = None,
    share: SharedRuns | None = None,
    raw_side: _Once | None = None,
    parallel: bool = False,
) -> Comparison:
    cfg, params_a, ca = prep.cfg, prep.params, prep.canonical
    storage_b = storage_dtype_b or storage_dtype_of(params_b)
    den = _sq_by_group(ca.params)
    # B one run of blocks at a time (:mod:`.streamed`; one run of every block where they cannot be
    # taken apart), the runs from the last down the helper's once A's probes are done
    if share is not None:
        assert a_side is not None
        share.collect = lambda: a_side()[1]
    cb, sq, resp_b = canonical_b_by_runs(cfg, params_b, ca, storage_b, probes, seed + 1, share)
    inv, inv_groups = relative(grouped(sq, params_b), den)  # in parameter order, as sq_by_group adds them
    if a_side is not None:  # A's probes, done meanwhile (or now, where nothing was forked)
        prep.response = a_side()[0]
    if raw_side is not None:
        raw, raw_groups = raw_side()
    else:
        raw, raw_groups = relative_distances(params_a, params_b)
    out = judge(den, (inv, inv_groups), (raw, raw_groups), prep.response, resp_b, probes, ca, cb)
    if with_element:
        with_element_found(out, lambda el: element_residual(cfg, params_a, params_b, el, parallel))
    return out
