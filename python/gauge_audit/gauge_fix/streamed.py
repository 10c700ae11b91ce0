"""compare's one loop over runs of blocks, and model B canonicalised in it: the one way compare
canonicalises B and probes either model, whole or fully streamed.

:class:`Runs` takes each run's A side from a source of runs — A's canonical form held whole
(:class:`WholeA`: the whole comparison, a model's rounding response) or A canonicalised run by run
(:mod:`.comparison_by_runs`) — and runs B against it (:class:`BRuns`, with B's probes) and A's
probes (:class:`.response.RunProbes`).  What differs between the whole and the streamed comparison
is only that source, and where the vocabulary-sized tensors go: into the first run, or chunk by
chunk after the runs.

With a reference (compare aligns B to A's canonical form) every gauge-fixing step but the stream
rotation acts inside one block, and every decision it takes is judged against a threshold that
does not depend on the other blocks: the dense steps before qk-gl have κ = 1, and with a
reference the steps from qk-gl on take no thresholded decisions (their compact freedoms are fitted
to the reference).  So B's canonical form can be computed run by run (the first run with the
embeddings and head records the rotation, later runs reuse it, as the probes of :mod:`.response`
do) and each run's records merged into the whole model's: elements joined along their layer axis
(a norm's part renamed to its block), κ the largest over the runs (the unit scalings' κ the ratio
of their extreme factors over all runs, as the step computes it), decisions by smallest margin and
summed counts, notes renamed to their blocks.  Per run the distances to A's canonical form and B's
rounding probes are taken, then the run is dropped: memory holds A's canonical form and one run
(B's canonical embeddings wait in a temporary file while the first run's probes run).  In
parallel the runs after the first are shared with a forked helper (:class:`SharedRuns`).

:func:`merge_runs` refuses (returns None) whatever it cannot merge exactly — runs with different
steps or decisions, decisions whose thresholds differ between runs, an element that is not keyed
by the tensors it acts on — and B is then one run of every block: the whole model through the same
code.  So is a model whose bias chain joins blocks (:func:`.response.blockwise`).
``tests/test_gauge_fix.py`` checks that runs of one block give the report of one run of every block.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol, cast

import torch

from ..actions import ACTIONS, Element
from ..actions.blockwise import block_of
from ..models.config import Config
from ..runtime import eps
from .base import Decision, Params, StepRecord, moved, renumbered, rounding_kappa, span_element
from .ffn import scaling_kappa
from .pipeline import (
    ROTATION,
    Canonical,
    canonicalize_owned,
    kept_permutations,
    permutations,
    rotation_index,
    stream_rotation,
    unfixed,
)
from .response import RunProbes, Spilled, Steps, block_runs, blockwise, outer_steps, run_slice, sq_distance

SPILL = 1 << 24  # outer tensors of at least this many entries (128 MiB in float64) wait in a file

# actions applied to the whole model at once (layout "whole") whose element is keyed by the tensors
# and norms it acts on, each part acting on its own: merged like a "norms" element
KEYED_BY_TENSOR = frozenset({"writer-ones", "reader-ones", "norm-shift-absorbed", "embed-offset"})

_BLOCK_NOTE = re.compile(r"\b(blocks?)([ .])(\d+)\b")


def _outer(name: str) -> bool:
    return block_of(name) is None


def _renamed(name: str, lo: int) -> str:
    return name if _outer(name) else moved(name, lo)


def _merge_keyed(runs: list[tuple[int, Element]]) -> dict[str, torch.Tensor]:
    """The parts of elements keyed by tensor or norm name, one per run: each run's block parts
    renamed to their blocks, the outer parts as the first run has them (later runs take the outer
    tensors along, not canonicalised), in the first run's order — the outer parts before its
    blocks', the blocks', the outer parts after."""
    before: dict[str, torch.Tensor] = {}
    after: dict[str, torch.Tensor] = {}
    inner: dict[str, torch.Tensor] = {}
    seen = False  # a block's part, in the first run's order
    for k, t in runs[0][1].parts.items():
        if block_of(k + ".") is not None:
            seen = True
        else:
            (after if seen else before)[k] = t
    for lo, el in runs:
        for k, t in el.parts.items():
            b = block_of(k + ".")
            if b is not None:
                inner[renumbered(k, b, b + lo)] = t
    return {**before, **inner, **after}


def _merge_element(action: str, runs: list[tuple[int, Element]]) -> Element | None:
    layout = ACTIONS[action].element_layout
    first = runs[0][1]
    if layout == "shared":  # one element for every block: the rotation the first run computed
        return first if all(el is first for _, el in runs) else None
    if layout == "layers":
        if any(set(el.parts) != set(first.parts) for _, el in runs):
            return None
        parts = {k: torch.cat([el.parts[k] for _, el in runs]) for k in first.parts}
        if action.endswith("-scaling") or action == "qk-norm-scale":  # the extreme factors' ratio
            kappa = scaling_kappa(parts["s" if "s" in parts else "c"])
        elif action == "latent-norm-scale":  # the extreme ratio per latent, over every layer
            kappa = max(scaling_kappa(t) for t in parts.values())
        else:
            kappa = max(el.kappa for _, el in runs)
        return Element(parts, kappa, first.note)
    if layout == "norms" or action in KEYED_BY_TENSOR:
        parts = _merge_keyed(runs)
        kappa = scaling_kappa(list(parts.values())) if action.endswith("-scaling") else max(el.kappa for _, el in runs)
        return Element(parts, kappa, first.note)
    return None  # coupling blocks through parts that name no tensor (a composite, a segment's shift)


def _merge_decisions(
    runs: list[list[Decision]], threshold: Callable[[float], float] | None = None
) -> list[Decision] | None:
    """One decision per kind from the runs' (None where they differ in kind, or in threshold).
    ``threshold``: the whole model's threshold of a sensitivity — every margin is judged again
    (a run's own threshold counted only its κ), at the largest of the runs' sensitivities (a
    step's sensitivity is the largest over the blocks it saw)."""
    keys = [(d.kind, d.where) for d in runs[0]]
    if any([(d.kind, d.where) for d in ds] != keys for ds in runs):
        return None
    out = []
    for i, (kind, where) in enumerate(keys):
        ds = [r[i] for r in runs]
        if threshold is not None and all(d.sensitivity is not None and d.margins is not None for d in ds):
            s = max(cast(float, d.sensitivity) for d in ds)
            margins = torch.cat([cast(torch.Tensor, d.margins) for d in ds])
            out.append(Decision.of(kind, where, margins, threshold(s), s, ds[0].joint))
            continue
        if any(d.threshold != ds[0].threshold for d in ds):
            return None
        if ds[0].joint:  # the largest margin over the parts
            margin = max(d.margin for d in ds)
            out.append(Decision(kind, where, margin, ds[0].threshold, 1, int(margin <= ds[0].threshold), joint=True))
            continue
        seen = [d for d in ds if d.n]
        margin = min(d.margin for d in seen) if seen else ds[0].margin
        out.append(Decision(kind, where, margin, ds[0].threshold, sum(d.n for d in ds), sum(d.n_ties for d in ds)))
    return out


def _notes(notes: list[str], lo: int, first: bool) -> list[str]:
    """A run's notes renamed to their blocks; a later run's notes about the embeddings and head
    (taken along, not canonicalised) dropped."""
    out = []
    for note in notes:
        if not first and not _BLOCK_NOTE.search(note):
            continue
        out.append(_BLOCK_NOTE.sub(lambda m: f"{m[1]}{m[2]}{int(m[3]) + lo}", note))
    return out


def _every_block(names: frozenset, n_layers: int) -> frozenset:
    """``names`` (the first run's) with each block tensor's name given for every block."""
    out = {k for k in names if _outer(k)}
    for k in names:
        b = block_of(k)
        if b is not None:
            out |= {renumbered(k, b, i) for i in range(n_layers)}
    return frozenset(out)


def merge_runs(
    cfg: Config, runs: list[tuple[int, list[StepRecord]]], storage_dtype: torch.dtype, rethreshold: bool = False
) -> Canonical | None:
    """The whole model's records from those of its runs (module docstring), as a :class:`Canonical`
    without parameters; None where they cannot be merged exactly.  ``rethreshold``: the runs were
    canonicalised without a reference, each at its own κ — every decision is judged again at the
    whole model's (the κ of the merged dense elements before its step, as
    :meth:`.base.Context.threshold` counts it)."""
    if len(runs) == 1 and runs[0][0] == 0 and not rethreshold:  # one run of every block: the model's own
        return Canonical(cfg, {}, list(runs[0][1]), unfixed(cfg), storage_dtype)
    steps = [(r.family, r.action) for r in runs[0][1]]
    if any([(r.family, r.action) for r in recs] != steps for _, recs in runs):
        return None
    records: list[StepRecord] = []
    u = eps(storage_dtype) / 2
    for i, (family, action) in enumerate(steps):
        per = [(lo, recs[i]) for lo, recs in runs]
        el = _merge_element(action, [(lo, r.element) for lo, r in per])
        decisions: list[Decision] | None
        if ACTIONS[action].element_layout == "shared":  # computed by the first run, given to the others
            decisions, notes = per[0][1].decisions, per[0][1].notes
            reads = _every_block(per[0][1].reads, cfg.n_layers)  # the first run's, for every block
        else:
            kappa = rounding_kappa(records)  # the merged dense elements before this step
            at = (lambda s, k=kappa: s * u * k) if rethreshold else None
            decisions = _merge_decisions([r.decisions for _, r in per], at)
            notes = [n for j, (lo, r) in enumerate(per) for n in _notes(r.notes, lo, j == 0)]
            reads = frozenset(_renamed(k, lo) for lo, r in per for k in r.reads)
        if el is None or decisions is None:
            return None
        writes = frozenset(_renamed(k, lo) for lo, r in per for k in r.writes)
        records.append(StepRecord(family, action, el, per[0][1].condition, decisions, notes, reads, writes))
    return Canonical(cfg, {}, records, unfixed(cfg), storage_dtype)


class SharedRuns:
    """B's runs of blocks shared between this process, which takes them from the first up, and a
    forked helper, which takes them from the last down once its own work is done (two cores: the
    helper's work, A's probes, is shorter than B's).  Each run's numbers are the same whichever
    process computes it (the draws are seeded per tensor, the sums taken per tensor and added in
    parameter order at the end), so the report does not depend on the split.  The helper needs
    what the first run computed (B's stream rotation and each probe's): sent through a pipe.
    Made before the fork; ``active`` is cleared where nothing was forked (this process then takes
    every run)."""

    def __init__(self, n_runs: int):
        import multiprocessing

        mp = multiprocessing.get_context("fork")
        self._next = mp.RawArray("i", [0, n_runs - 1])  # the next run from the first, from the last
        self._lock = mp.Lock()
        self._recv, self._send = mp.Pipe(duplex=False)
        self.active = True
        self.collect: Callable[[], dict] | None = None  # the helper's runs (set by the caller)

    def claim(self, last: bool) -> int | None:
        """The next run not taken yet (from the last down: never the first), or None."""
        with self._lock:
            lo, hi = self._next[0], self._next[1]
            if lo > hi or (last and hi == 0):
                return None
            if last:
                self._next[1] = hi - 1
                return hi
            self._next[0] = lo + 1
            return lo

    def post_first(self, rotation: Element | None, rotations: list) -> None:
        """This process: what the first run computed, for the helper (sent from a thread: the
        helper reads it only when its own work is done)."""
        import pickle
        import threading

        if not self.active:
            return
        data = pickle.dumps((rotation, rotations), protocol=pickle.HIGHEST_PROTOCOL)
        threading.Thread(target=self._send.send_bytes, args=(data,), daemon=True).start()

    def abandon(self) -> None:
        """This process: no runs for the helper (an error before the first run was done): the
        helper's :meth:`first` returns None at once."""
        import pickle

        with self._lock:
            self._next[1] = -1
        if self.active:
            self._send.send_bytes(pickle.dumps(None))

    def first(self) -> tuple[Element | None, list] | None:
        """The helper: what the first run computed (waits for it), or None (:meth:`abandon`)."""
        import pickle

        return pickle.loads(self._recv.recv_bytes())


def b_runs(cfg: Config, params_b: Params) -> list[tuple[int, int]]:
    """B's runs of blocks (first block, count): those of :func:`.response.block_runs`, or one run of
    every block where a bias chain joins them."""
    return block_runs(cfg, params_b) if blockwise(cfg, params_b) else [(0, cfg.n_layers)]


def against_reference(
    cfg_run: Config,
    sub: dict[str, torch.Tensor],
    reference: Params,
    storage_dtype: torch.dtype,
    rotation: Element | None,
) -> Canonical:
    """One run of B's blocks (``sub``: renumbered from 0, with the outer tensors; a dict handed
    over, changed in place) canonicalised against the reference's same run, B's stream rotation
    given where its first run computed it."""
    keep = {ROTATION: rotation} if rotation is not None else None
    return canonicalize_owned(cfg_run, sub, reference=reference, storage_dtype=storage_dtype, keep=keep)


# ----------------------------------------------------------------------------- the runs of a comparison
@dataclass
class ARun:
    """A's side of one run of blocks, as a source of runs gives it: the reference run the steps
    align to (renumbered from 0, with the outer tensors or their stand-ins), A's canonical tensors
    by name (B's distances and A's probes are measured against them), A's canonical outer tensors
    (its probes' first run), the permutations A's probes keep."""

    ref: Params
    canonical: Mapping[str, torch.Tensor | Spilled]
    outer: Mapping[str, torch.Tensor | Spilled]
    kept: dict[str, Element]


class RunSource(Protocol):
    """Where a comparison's runs take A's side from: ``run(j, lo, n, names)`` enters run ``j``
    (blocks lo … lo+n−1, their tensors ``names``) and gives its :class:`ARun`, released on exit."""

    def run(self, j: int, lo: int, n: int, names: list[str]) -> AbstractContextManager[ARun]: ...


class WholeA:
    """A source of runs holding A's canonical form whole, in memory: each run a slice of it (the
    whole comparison, and a model's rounding response); ``reference``: what the steps align to
    (A's own canonical form in compare)."""

    def __init__(self, cfg: Config, canonical: Canonical, reference: Params, outer: list[str]):
        self.cfg, self.canonical, self.reference = cfg, canonical, reference
        self.ref_outer = {k: reference[k] for k in outer}
        self.outer: dict[str, torch.Tensor | Spilled] = {k: canonical.params[k] for k in outer}

    @contextmanager
    def run(self, j: int, lo: int, n: int, names: list[str]) -> Iterator[ARun]:
        kept = {}
        for r in permutations(self.canonical.records):  # the whole model's, on these blocks
            part = span_element(ACTIONS[r.action], self.cfg, r.element, lo, n)
            if part is not None:
                kept[r.family] = part
        yield ARun({**run_slice(self.reference, names, lo), **self.ref_outer}, self.canonical.params, self.outer, kept)


class Runs:
    """compare's one loop over runs of blocks, whole or fully streamed: per run, A's side from a
    source of runs (:class:`WholeA`, or :mod:`.comparison_by_runs`'s A canonicalised run by run),
    then B canonicalised against it with B's probes (:class:`BRuns`) and A's probes (a
    :class:`.response.RunProbes`); either side may be absent (A's response alone; B alone where a
    helper process takes A's probes)."""

    def __init__(self, source: RunSource, runs: list[tuple[int, int]], b: BRuns | None, a_probes: RunProbes | None):
        self.source, self.runs, self.b, self.a_probes = source, runs, b, a_probes

    def run(self, j: int, a: bool = True, b: bool = True) -> None:
        """Run ``j``: B's side (``b``) and A's probes (``a``)."""
        lo, n = self.runs[j]
        rp = self.a_probes if self.b is None else self.b.rp
        assert rp is not None
        names = rp.names(lo, n)
        with self.source.run(j, lo, n, names) as ar:
            if b and self.b is not None:
                self.b.run(j, lo, n, ar.ref, ar.canonical)
            if a and self.a_probes is not None:
                pa = self.a_probes
                here = pa.held(j, lo, n)
                pa.run(j, lo, n, here, ar.ref, {moved(k, -lo): ar.canonical[k] for k in names}, ar.outer, ar.kept)
                del here

    def every(self, a: bool = True, b: bool = True) -> None:
        for j in range(len(self.runs)):
            self.run(j, a, b)

    def shared(self, share: SharedRuns | None) -> None:
        """B's runs, those from the last down a helper's (:meth:`helper`) where ``share`` is
        active, collected here."""
        if share is None or not share.active:
            self.every(a=False)
            return
        assert self.b is not None
        posted = False
        try:
            while (j := share.claim(last=False)) is not None:
                self.run(j, a=False)
                if j == 0:
                    share.post_first(self.b.rotation, self.b.rp.rotations)
                    posted = True
        finally:
            if not posted:  # an error before the helper could start: it must not wait for run 0
                share.abandon()
        assert share.collect is not None
        self.b.add(share.collect())

    def helper(self, share: SharedRuns) -> dict:
        """The helper's share of :meth:`shared`: B's runs not taken yet, from the last down, with
        the first run's rotations from the other process (none where that process gave up)."""
        assert self.b is not None
        first = share.first() if share.active else None
        if first is None:
            return self.b.result()
        self.b.rotation, self.b.rp.rotations = first
        while (j := share.claim(last=True)) is not None:
            self.run(j, a=False)
        return self.b.result()


class BRuns:
    """B canonicalised against the reference run by run, with its probes: compare's one
    implementation of B, whole or fully streamed (fed by :class:`Runs`).  The runs in any order
    after the first.

    ``rp``: B's probes (:class:`.response.RunProbes`), whose options say how a run is fed: the
    outer tensors the first run canonicalises and measures (``rp.outer``), the stand-in rows every
    run takes along (``rp.stand_in``) and the runs' vocabulary.  ``along``: the outer tensors the
    runs after the first take along (default: the probes'); ``rotation``: B's stream rotation where
    it is given (else the first run computes it); ``spill``: B's canonical runs wait for their
    probes in temporary files (else in memory).  Per tensor, ``sq`` holds ‖canon B − canon A‖²;
    per run, ``records`` its steps; ``outer_steps`` the first run's steps on the embeddings and head
    (where the probes record theirs)."""

    def __init__(
        self, rp: RunProbes, *, along: Params | None = None, rotation: Element | None = None, spill: bool = False
    ):
        self.rp = rp  # B's probes hold B's configuration, parameters and storage precision
        self.along = rp.taken_along if along is None else along
        self.rotation, self.spill = rotation, spill
        self.sq: dict[str, float] = {}
        self.records: dict[int, tuple[int, list[StepRecord]]] = {}
        self.outer_steps: Steps = []

    def run(self, j: int, lo: int, n: int, ref_run: Params, a_base: Mapping[str, torch.Tensor | Spilled]) -> None:
        """Run ``j`` (blocks lo … lo+n−1) against ``ref_run`` (the reference's run renumbered from
        0, with its outer tensors) and ``a_base`` (A's canonical tensors by name, the distances'
        other side)."""
        rp = self.rp
        names = rp.names(lo, n)
        here = rp.held(j, lo, n)
        sub = {moved(k, -lo): here[k].detach().to("cpu", torch.float64) for k in names}
        sub.update({k: here[k].detach().to("cpu", torch.float64) for k in rp.outer} if j == 0 else self.along)
        sub.update(rp.stand_in)
        cfg_run = rp.cfg.with_(n_layers=n, **rp.run_changes)
        c = against_reference(cfg_run, sub, ref_run, rp.storage_dtype, self.rotation)
        base_outer: dict[str, torch.Tensor | Spilled] = {}  # the probes need it in the first run only
        if j == 0:
            if self.rotation is None:
                self.rotation = stream_rotation(c.records)
            for k in rp.outer:
                self.sq[k] = sq_distance(c.params[k], ref_run[k])
            # the canonical embeddings and head in a temporary file while the probes run
            base_outer = {k: Spilled(v) if v.numel() >= SPILL else v for k, v in c.params.items() if k in rp.outer}
            if rp.record_outer:
                self.outer_steps = outer_steps(cfg_run, c.records)
        for k in names:
            self.sq[k] = sq_distance(c.params[moved(k, -lo)], a_base[k])
        kept = kept_permutations(c.records)
        base: dict[str, torch.Tensor | Spilled] = {}
        for k in names:
            v = c.params[moved(k, -lo)]
            base[moved(k, -lo)] = Spilled(v) if self.spill else v
        self.records[j] = (lo, list(c.records))
        del c, sub  # the outer tensors: only in base_outer now
        rp.run(j, lo, n, here, ref_run, base, base_outer, kept)
        for f in [*base.values(), *base_outer.values()]:
            if isinstance(f, Spilled):
                f.close()
        del here, base, base_outer

    def result(self) -> dict:
        """What the helper sends back: its runs' records and squared distances."""
        return {"records": self.records, "sq": self.sq, "probes": self.rp.sq}

    def add(self, other: dict) -> None:
        """The helper's runs: its records hold a copy of the first run's rotation, replaced by the
        element itself (runs merge a shared element when every run holds that one)."""
        for j, (lo, recs) in other["records"].items():
            i = rotation_index(recs)
            if i is not None:
                r = recs[i]
                assert self.rotation is not None and all(
                    torch.equal(r.element.parts[k], self.rotation.parts[k]) for k in self.rotation.parts
                )
                recs[i] = dataclasses.replace(r, element=self.rotation)
            self.records[j] = (lo, recs)
        self.sq.update(other["sq"])
        for mine, theirs in zip(self.rp.sq, other["probes"]):
            mine.update(theirs)


def response_by_runs(
    cfg: Config,
    params: Params,
    canonical: Canonical,
    reference: Params,
    probes: int,
    seed: int,
    u: float,
    runs: list[tuple[int, int]] | None = None,
) -> dict[str, float]:
    """Per group, the largest ‖canon(θ + δ) − canon(θ)‖² over ``probes`` simulated roundings,
    one run of blocks at a time (:mod:`.response`): the runs of :func:`.response.block_runs`, which
    needs ``blockwise(cfg, params)``, or ``runs`` given (one run of every block where a stretch
    joins them)."""
    rp = RunProbes(cfg, params, probes, seed, u, canonical.storage_dtype, canonical.params)
    source = WholeA(cfg, canonical, reference, rp.outer)
    Runs(source, block_runs(cfg, params) if runs is None else runs, None, rp).every()
    return rp.worst()


def _b_side(cfg, params_b, reference: Canonical, storage_dtype, probes, seed, whole=False) -> Runs:
    """The whole comparison's B (:func:`canonical_b_by_runs`): its probes against A's canonical
    form in memory, every outer tensor in the first run."""
    rp = RunProbes(cfg, params_b, probes, seed, torch.finfo(storage_dtype).eps / 2, storage_dtype, reference.params)
    runs = b_runs(cfg, params_b) if not whole else [(0, cfg.n_layers)]
    source = WholeA(cfg, reference, reference.params, rp.outer)
    return Runs(source, runs, BRuns(rp), None)


def canonical_b_by_runs(
    cfg: Config,
    params_b: Params,
    reference: Canonical,
    storage_dtype: torch.dtype,
    probes: int,
    seed: int,
    share: SharedRuns | None = None,
    whole: bool = False,
) -> tuple[Canonical, dict[str, float], dict[str, float]]:
    """B canonicalised against ``reference`` (A's canonical form) one run of blocks at a time
    (:func:`b_runs`; ``whole``: one run of every block): its records merged into a
    :class:`Canonical` without parameters, ‖canon(B) − canon(A)‖² per tensor, B's rounding response
    per group as :func:`response_by_runs` measures it.  Where the runs' records cannot be merged
    exactly, B again as one run of every block.  ``share``: the runs from the last down are a
    helper's (:func:`helper_b_runs`), collected here."""
    side = _b_side(cfg, params_b, reference, storage_dtype, probes, seed, whole)
    side.shared(share)
    b = side.b
    assert b is not None
    merged = merge_runs(cfg, [b.records[j] for j in range(len(side.runs))], storage_dtype)
    if merged is None:
        assert len(side.runs) > 1  # one run of every block is the model's own records
        return canonical_b_by_runs(cfg, params_b, reference, storage_dtype, probes, seed, whole=True)
    return merged, b.sq, b.rp.worst()


def helper_b_runs(share: SharedRuns, *b_side) -> dict:
    """The helper's share of :func:`canonical_b_by_runs` (``b_side``: its arguments before
    ``share``)."""
    return _b_side(*b_side).helper(share)
