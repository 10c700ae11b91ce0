"""``compare`` for models whose float64 copies do not fit in memory: one run of blocks at a time.

Where :func:`.by_runs.streamable` holds (RMSNorm streams without biases, learned positions or a
parallel residual), the comparison of :func:`.comparison.compare` is computed without holding
either model whole:

1. the stream rotations from chunks of vocabulary rows of the embeddings: A's from its Gram
   (:class:`.by_runs.CanonicalByRuns`); B's and every probe's as the orthogonal Procrustes fit to
   A's canonical embedding W_E,A·R_A, from (W_E,B)ᵀ·W_E,A summed over the chunks (a probe's
   perturbed chunks drawn as they are used);
2. per run of blocks: A's canonical run; B's run canonicalised against it (B's rotation given);
   each probe of A and of B on that run, with the unperturbed run's permutations and the probe's
   rotation given and A's canonical run the reference — the squared distances per tensor;
3. the embeddings and head chunk by chunk: the elements each model and each probe applies to them
   (from its first run) applied to the chunk, the squared distances summed over the chunks;
4. for EQUIVALENT, the element's residual ‖g·A − B‖ block by block and chunk by chunk.

Every tensor goes through the same steps as in the whole comparison, and the probes draw the same
numbers (each tensor from its own seeded generator; a chunk of vocabulary entries is a contiguous
stretch of the draw, :func:`.response.perturbed`), so the report is the whole comparison's up to
the rounding of sums taken in another order (``tests/test_comparison_by_runs.py``).  Memory: a run
of blocks and its transform (A's and B's canonical runs wait in temporary files, read back tensor by
tensor as a step asks), the chunks and d × d matrices.  Time: per run 2·(1 + probes) canonicalisations, as the whole comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..actions import ACTIONS, Element, composite
from ..actions.blockwise import restrict
from ..actions.stream import remember_rotation, rotation_and_inverse
from ..errors import GaugeAuditError
from ..models.config import Config, same_architecture
from ..runtime import eps, generator, matmul, one_thread, wide_products
from .base import Decision, Params, StepRecord, moved
from .by_runs import STAND_IN, CanonicalByRuns, streamable, with_rotation_decided
from .comparison import Comparison, block_terms, judge, relative, with_element_found
from .pipeline import kept_permutations, validate
from .response import (
    OWN_ROTATION,
    VOCAB_AXIS,
    RunProbes,
    Spilled,
    Steps,
    grouped,
    outer_applied,
    perturb_with,
    probe_seed,
    sq_distance,
    worst,
)
from .streamed import ARun, BRuns, Runs, merge_runs

KEEP_LAST = 1 << 25  # entries: a spilled reference keeps its last read tensor up to this size
_WHERE = "stream rotation (embedding) (Procrustes to the reference)"


def compare_by_runs(
    cfg_a: Config,
    params_a: Params,
    cfg_b: Config,
    params_b: Params,
    *,
    probes: int = 3,
    seed: int = 0,
    storage_dtype_a: torch.dtype,
    storage_dtype_b: torch.dtype,
    with_element: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    """:func:`.comparison.compare` one run of blocks at a time (module docstring): the same
    report up to rounding, holding a run and its transform.  ``params_a`` / ``params_b``: any mapping, e.g. a
    checkpoint's parameters read on access in their stored dtype.  ``progress(done, total)``:
    called per run of blocks compared."""
    same_architecture(cfg_a, cfg_b)
    why = streamable(cfg_a)
    if why is not None:
        raise GaugeAuditError(f"compare one run of blocks at a time does not support {why}")
    if probes < 1:
        raise GaugeAuditError("probes must be >= 1")
    validate(cfg_a, params_a)
    validate(cfg_b, params_b)
    with one_thread(), wide_products():
        return _ByRuns(cfg_a, params_a, params_b, probes, seed, storage_dtype_a, storage_dtype_b).compare(
            with_element, progress
        )


def _apply(cfg: Config, small: Params, name: str, chunk: torch.Tensor, steps: Steps) -> torch.Tensor:
    return outer_applied(cfg, small, name, chunk, steps)[name]


def _draw(x: torch.Tensor, axis: int, u: float, g: torch.Generator) -> torch.Tensor:
    """A chunk's perturbation, continuing the tensor's draw (along its vocabulary axis)."""
    if axis == 1 and x.dim() == 2:
        return perturb_with(x.T, u, g).T.contiguous()
    return perturb_with(x, u, g)


def _read_once(params: Params, name: str) -> torch.Tensor:
    """``params[name]``, with a lazily read checkpoint's own copy of its last read let go (its
    ``forget``): the head W_U is stored transposed, and the read held for the next access would
    sit beside the copy returned for the whole sweep over its chunks."""
    t = params[name]
    forget = getattr(params, "forget", None)
    if forget is not None:
        forget()
    return t


def _procrustes(cross: torch.Tensor) -> tuple[Element, float]:
    """The orthogonal Procrustes fit from xᵀ·ref (:func:`.base.procrustes`) and its conditioning
    (the ratio of the extreme singular values, the decision of :func:`.base.gram_axes`)."""
    u, s, vh = torch.linalg.svd(cross)
    return Element({"R": u @ vh}, 1.0), float(s[-1] / s[0]) if float(s[0]) > 0 else 0.0


def _given(held: _HeldRotation) -> Callable[[], Element]:
    """A probe's rotation as :class:`.response.RunProbes` takes one given: read back at each run."""
    return lambda: Element({"R": held.tensor()}, 1.0)


class _SpilledRun(Mapping[str, torch.Tensor]):
    """A canonical run as a reference: its block tensors in temporary files, each read back when a
    step asks for it (the probes' steps read a few: the attention factors, the FFN's output
    weights), the small ones in memory."""

    def __init__(self, files: Mapping[str, Spilled], small: Mapping[str, torch.Tensor]):
        self.files, self.small = files, small
        self._last: tuple[str | None, torch.Tensor | None] = (None, None)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.small:
            return self.small[name]
        if self._last[0] == name:  # the per-head steps ask for a layer's attention weights per head
            assert self._last[1] is not None
            return self._last[1]
        t = self.files[name].tensor()
        # the last one kept where it is small beside a run (attention, not FFN, weights)
        self._last = (name, t) if t.numel() <= KEEP_LAST else (None, None)
        return t

    def __iter__(self) -> Iterator[str]:
        yield from self.files
        yield from self.small

    def __len__(self) -> int:
        return len(self.files) + len(self.small)


class _HeldRotation:
    """A stream rotation validated and inverted once for the whole comparison.  A's, B's and every
    probe's rotation is applied in each run of blocks and each sweep over the vocabulary, and the
    stream keeps the last two validated (at d = 4 096 a validation and inversion take ≈ 8 s on one
    thread: eight per run of blocks before).  R stays where it is (A's and B's, in memory) or goes to
    a temporary file (a probe's, 134 MB at d = 4 096), its inverse to another; each use hands both
    to the stream's cache."""

    def __init__(self, cfg: Config, r: torch.Tensor, in_file: bool):
        self.cfg = cfg
        _, r_inv = rotation_and_inverse(cfg, r)
        self._r: torch.Tensor | Spilled = Spilled(r) if in_file else r
        self._inv = Spilled(r_inv)

    def tensor(self) -> torch.Tensor:
        """R (read back, or the tensor given), held by the stream as validated with its inverse."""
        r = self._r.tensor() if isinstance(self._r, Spilled) else self._r
        remember_rotation(self.cfg, r, self._inv.tensor())
        return r

    def close(self) -> None:
        if isinstance(self._r, Spilled):
            self._r.close()
        self._inv.close()


@dataclass
class _Side:
    """One model's probes: its storage, their rotations (from the embeddings, held in files) and
    the probe loop (:class:`.response.RunProbes`: per probe its response² per tensor, its
    perturbed small outer tensors and its steps on the embeddings and head, for the chunks)."""

    params: Params
    seed: int
    storage: torch.dtype
    held: list[_HeldRotation | None]
    probes: RunProbes

    @property
    def u(self) -> float:
        return self.probes.u

    @property
    def index(self) -> dict[str, int]:  # a tensor's place in its checkpoint: part of its probes' seeds
        return self.probes.index


class _ByRuns:
    """One comparison's state: the rotations, then per tensor the squared distances and responses
    as the runs and chunks produce them."""

    def __init__(self, cfg, pa, pb, probes, seed, storage_a, storage_b):
        self.cfg, self.pa, self.pb, self.probes = cfg, pa, pb, probes
        self.A = CanonicalByRuns(cfg, pa, storage_a)  # A's stream rotation from its embedding's Gram
        self.small = [k for k in self.A.outer if k not in VOCAB_AXIS]
        self.small_b = {k: pb[k].to(torch.float64) for k in self.small}
        # the embeddings and head in every run's input: a few zero rows (no block's element
        # depends on them; A's and B's rotations and the probes' are given)
        self.zero_rows = {k: v for k, v in self.A.stand_in.items() if k in VOCAB_AXIS}

        def side(params: Params, seed: int, storage: torch.dtype) -> _Side:
            # the probes perturb the small outer tensors; later runs take A's along as read
            rp = RunProbes(
                cfg,
                params,
                probes,
                seed,
                eps(storage) / 2,
                storage,
                self.A.small0,
                outer=self.small,
                stand_in=self.zero_rows,
                vocab=min(cfg.vocab, STAND_IN),
                record_outer=True,
            )
            return _Side(params, seed, storage, [None] * probes, rp)

        self.sides = (side(pa, seed, storage_a), side(pb, seed + 1, storage_b))
        # per tensor: ‖B − A‖², ‖A‖², ‖canon B − canon A‖², ‖canon A‖² (each probe's response²: self.sides)
        self.raw: dict[str, float] = {}
        self.raw_den: dict[str, float] = {}
        self.den: dict[str, float] = {}
        self.rot_b, self.fit_b, self.sides[0].held, self.sides[1].held = self._rotations()
        # B's runs against A's (:class:`.streamed.BRuns`, as the whole comparison's), B's rotation
        # given, its canonical runs in temporary files while its probes run
        self.b = BRuns(self.sides[1].probes, along=self.small_b, rotation=self.rot_b, spill=True)
        self.inv = self.b.sq  # ‖canon B − canon A‖² per tensor: the blocks' from B's runs, then the chunks'
        self.loop = Runs(self, self.A.runs, self.b, self.sides[0].probes)
        for s in self.sides:  # each probe's rotation read back from its file at each of its runs
            s.probes.rotations = [None if h is None else _given(h) for h in s.held]
        # A's and B's rotations, validated and inverted here once (the probes' in _rotations)
        self.held: list[_HeldRotation] = []
        for el in (self.A.rotation, self.rot_b):
            if el is not None:
                self.held.append(_HeldRotation(cfg, el.parts["R"], in_file=False))

    # ------------------------------------------------------------------ 1 the rotations
    def _rotations(self):
        """B's rotation and its fit, the probes' rotations: Procrustes fits to A's canonical
        embedding from (W_E,x)ᵀ·W_E,A summed over chunks of rows, then ·R_A."""
        probes = self.probes
        if self.A.rotation is None:
            return None, None, [None] * probes, [None] * probes
        r_a, d, name = self.A.rotation.parts["R"], self.cfg.d_model, "embed.W_E"
        sa, sb = self.sides
        wa, wb = sa.params[name], sb.params[name]
        ga = [generator(probe_seed(sa.seed, p, sa.index[name])) for p in range(probes)]
        gb = [generator(probe_seed(sb.seed, p, sb.index[name])) for p in range(probes)]
        cross = [torch.zeros(d, d, dtype=torch.float64) for _ in range(1 + 2 * probes)]
        for a, n in self.A.vocabulary_chunks():
            xa = wa[a : a + n].to(torch.float64)
            cross[0] += matmul(wb[a : a + n].to(torch.float64).T, xa)
            for p in range(probes):
                cross[1 + p] += matmul(perturb_with(wa[a : a + n], sa.u, ga[p]).T, xa)
                cross[1 + probes + p] += matmul(perturb_with(wb[a : a + n], sb.u, gb[p]).T, xa)
        del wa, wb, xa  # as read (bfloat16: 1 GB each at Llama-3-8B's vocabulary)
        # each product let go once fitted, the probes' rotations in temporary files until their
        # runs (d × d: 134 MB each at d = 4096)
        rot_b, fit_b = _procrustes(matmul(cross[0], r_a))
        rots: list[_HeldRotation | None] = []
        for i in range(1, len(cross)):
            rots.append(_HeldRotation(self.cfg, _procrustes(matmul(cross[i], r_a))[0].parts["R"], in_file=True))
            cross[i] = torch.empty(0)
        return rot_b, fit_b, rots[:probes], rots[probes:]

    # ------------------------------------------------------------------ 2 the runs of blocks
    @contextmanager
    def run(self, j: int, lo: int, n: int, names: list[str]) -> Iterator[ARun]:
        """A's side of run ``j`` for :class:`.streamed.Runs` (this comparison is its source of
        runs): A's canonical run computed, its raw and canonical norms taken, and the run held in
        temporary files while B's run and both sides' probes use it."""
        A = self.A
        # the raw distances first: the models' tensors read when used, not held beside a run in
        # float64 (and a checkpoint's last read, held for its next, is then a block's)
        for k in names:
            ta = self.pa[k]
            self.raw[k] = sq_distance(self.pb[k], ta)
            self.raw_den[k] = sq_distance(ta)
            del ta
        self._remember(0)
        a_run = A.canonical_run(j)  # A's canonical run (its records kept by A)
        for k in names:
            self.den[k] = sq_distance(a_run[k])
        # A's canonical run in a temporary file: the reference of B's run and of every probe, read
        # back tensor by tensor as their steps ask (the matching steps read the attention and FFN
        # weights one step at a time; the probes' steps a few), and what A's probes are measured
        # against; B's canonical run likewise for B's probes
        base_a = {k: Spilled(a_run[k]) for k in names}
        del a_run
        ref = _SpilledRun({moved(k, -lo): base_a[k] for k in names}, {**A.small, **self.zero_rows})
        try:
            self._remember(1)  # B's rotation, for B's run
            yield ARun(ref, base_a, A.small, kept_permutations(A.records[j][1]))
        finally:
            for v in base_a.values():
                v.close()

    def _with_fit(self, records: list[StepRecord]) -> list[StepRecord]:
        """B's first run's records with the rotation's record as the whole comparison makes it:
        its condition, and the Procrustes fit's decision at the threshold of that point."""
        if self.rot_b is None:
            return records
        fit = self.fit_b
        assert fit is not None
        with_rotation_decided(records, self.sides[1].u, lambda at: [Decision.of("match", _WHERE, [fit], at(2.0), 2.0)])
        return records

    # ------------------------------------------------------------------ 3 the embeddings and head
    def _remember(self, side: int) -> None:
        """A's (0) or B's (1) rotation handed to the stream's cache, validated and inverted."""
        if side < len(self.held):
            self.held[side].tensor()

    def _with_rotation(self, steps: Steps, rotation: _HeldRotation | None) -> Steps:
        """A probe's steps on the embeddings and head with its rotation read back in its place."""
        if rotation is None:
            return steps
        return [(a, Element({"R": rotation.tensor()}, 1.0) if el is OWN_ROTATION else el) for a, el in steps]

    def _vocabulary(self) -> None:
        """Every vocabulary-sized tensor chunk by chunk: canonical A and B, the probes; and the
        Gram of A's canonical embedding (the rotation's condition residual).  One model or probe
        at a time over all the chunks, so that each one's rotation is validated and inverted once
        (at d = 4 096 that is most of a chunk's work: per chunk and rotation ≈ 3.3 d³ flops against
        the product's 2·d²·rows): A's and B's canonical chunks wait in temporary files for the
        probes (2 · vocab · d float64 values on disk, not in memory).  Every sum is taken over the
        chunks in their order, as before."""
        cfg, A, probes = self.cfg, self.A, self.probes
        gram = torch.zeros(cfg.d_model, cfg.d_model, dtype=torch.float64) if A.rotation is not None else None
        assert A.outer_steps is not None
        chunks = list(A.vocabulary_chunks())
        for name in A.vocab_sized:
            axis = VOCAB_AXIS[name]
            ta, tb = _read_once(self.pa, name), _read_once(self.pb, name)

            def chunk(t: torch.Tensor, a: int, n: int, axis: int = axis) -> torch.Tensor:
                return t.narrow(axis, a, n).to(torch.float64).contiguous()

            sums = {"raw": 0.0, "raw_den": 0.0, "inv": 0.0, "den": 0.0}
            base_a: list[Spilled] = []
            base_b: list[Spilled] = []
            try:
                self._remember(0)
                for a, n in chunks:  # A's canonical chunks
                    ca = _apply(cfg, A.small0, name, chunk(ta, a, n), A.outer_steps)
                    sums["den"] += sq_distance(ca)
                    if gram is not None and name == "embed.W_E":
                        gram += matmul(ca.T, ca)
                    base_a.append(Spilled(ca))
                    del ca
                self._remember(1)
                for (a, n), ca_file in zip(chunks, base_a):  # B's, against them
                    xa, xb = chunk(ta, a, n), chunk(tb, a, n)
                    sums["raw"] += sq_distance(xb, xa)
                    sums["raw_den"] += sq_distance(xa)
                    cb = _apply(cfg, self.small_b, name, xb, self.b.outer_steps)
                    sums["inv"] += sq_distance(cb, ca_file)
                    base_b.append(Spilled(cb))
                    del xa, xb, cb
                self.raw[name], self.raw_den[name] = sums["raw"], sums["raw_den"]
                self.inv[name], self.den[name] = sums["inv"], sums["den"]
                for s, t, base in ((self.sides[0], ta, base_a), (self.sides[1], tb, base_b)):
                    for p in range(probes):
                        g = generator(probe_seed(s.seed, p, s.index[name]))
                        steps = self._with_rotation(s.probes.outer_steps[p], s.held[p])
                        small = s.probes.first_outer[p]
                        total = 0.0
                        for (a, n), c_file in zip(chunks, base):  # the probe's draw continues chunk by chunk
                            total += sq_distance(
                                _apply(cfg, small, name, _draw(chunk(t, a, n), axis, s.u, g), steps), c_file
                            )
                        s.probes.sq[p][name] = total
                        del steps
            finally:
                for f in [*base_a, *base_b]:
                    f.close()
            del ta, tb
        for k in self.small:  # the small outer tensors' raw distance
            self.raw[k] = sq_distance(self.pb[k], self.pa[k])
            self.raw_den[k] = sq_distance(self.pa[k])
        if gram is not None:
            A.embedding_gram = gram

    # ------------------------------------------------------------------ the comparison
    def compare(self, with_element: bool, progress: Callable[[int, int], None] | None) -> Comparison:
        runs = len(self.A.runs)
        try:
            for j in range(runs):
                self.loop.run(j)
                if progress is not None:
                    progress(j + 1, runs)
            for k in self.small:  # A's canonical small outer tensors, from its first run
                self.den[k] = sq_distance(self.A.small[k])
            self._with_fit(self.b.records[0][1])
            self._vocabulary()
        finally:
            for rot in [*self.sides[0].held, *self.sides[1].held, *self.held]:
                if rot is not None:
                    rot.close()
        ca = self.A.canonical()  # every run recorded: no further pass
        cb = merge_runs(self.cfg, [self.b.records[j] for j in range(runs)], self.sides[1].storage)
        if cb is None:
            raise GaugeAuditError("B's runs of blocks took different steps: not compared one run at a time")

        order_a, order_b = list(self.pa), list(self.pb)
        den = grouped(self.den, order_a)
        out = judge(
            den,
            relative(grouped(self.inv, order_b), den),
            relative(grouped(self.raw, order_b), grouped(self.raw_den, order_a)),
            worst(self.sides[0].probes.sq, order_a),
            worst(self.sides[1].probes.sq, order_b),
            self.probes,
            ca,
            cb,
        )
        if with_element:
            with_element_found(out, self._residual)
        return out

    # ------------------------------------------------------------------ 4 the element's residual
    def _residual(self, el: Element) -> float:
        """‖g·A − B‖_F / ‖B‖_F: block by block (:func:`.comparison.block_terms`), the
        embeddings and head chunk by chunk."""
        cfg, A = self.cfg, self.A
        steps = composite.steps(el)
        outer = [(a, restrict(ACTIONS[a], cfg, s, None)) for a, s in steps]
        on_outer = [(a, part) for a, part in outer if part is not None]
        small_a = {k: self.pa[k].to(torch.float64) for k in self.small}
        num = den = 0.0
        small: dict = {}  # g applied to the small outer tensors: beside the first chunk
        for name in A.vocab_sized:
            axis = VOCAB_AXIS[name]
            ta, tb = _read_once(self.pa, name), _read_once(self.pb, name)
            for a, n in A.vocabulary_chunks():
                xa = ta.narrow(axis, a, n).to(torch.float64).contiguous()
                xb = tb.narrow(axis, a, n)
                state = outer_applied(cfg, small_a, name, xa, on_outer)
                small = small or {k: state[k] for k in self.small}
                num += sq_distance(xb, state[name])
                den += sq_distance(xb)
                del xa, xb, state
            del ta, tb
        for k in self.small:
            num += sq_distance(self.pb[k], small[k])
            den += sq_distance(self.pb[k])
        runs: list[tuple[int | None, list[str]]] = [(b, A.blocks[b]) for b in range(cfg.n_layers)]
        for n_, d_ in block_terms(cfg, self.pa, self.pb, steps, runs):
            num += n_
            den += d_
        return (num / den) ** 0.5 if den > 0 else num**0.5
