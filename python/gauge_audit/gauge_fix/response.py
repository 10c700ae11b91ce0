"""compare's rounding response, one run of blocks at a time.

The response of a model's canonical form to a simulated rounding δ = u·|θ|⊙z of its parameters
(:func:`gauge_audit.gauge_fix.comparison.rounding_response_recanonicalised` is its plain
definition: the whole perturbed model canonicalised again) is computed here without ever holding a
perturbed float64 copy of the whole model.  Every gauge-fixing step but two acts inside one block
(its element for block i is computed from block i's tensors and changes only them); the stream
rotation is computed from the embeddings alone and applied to every block; the bias chain's
stretches join consecutive blocks.  So, without bias-chain stretches, the canonical form of block
i's tensors depends only on block i's tensors and the rotation:

* run 0 canonicalises the embeddings, the final norm and head together with the first blocks
  (all perturbed), and records the rotation it computed from the perturbed embeddings;
* every further run canonicalises a sub-model of a few consecutive blocks (perturbed; the
  embeddings and head unperturbed, taken along only because the steps look them up, their result
  ignored) with that rotation and the unperturbed run's permutations reused.

Each run is the same arithmetic the whole-model probe performs on those tensors, so per group the
squared responses agree with the plain definition to the rounding of summing them
(``tests/test_gauge_fix.py``); a model with stretches is probed whole.  The draws: each tensor's z
from its own seeded generator (:func:`probe_seed`), so a run can draw its tensors in any order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import torch

from ..actions import ACTIONS, Element
from ..actions.blockwise import block_of, restrict
from ..actions.offsets import segments
from ..models.config import Config
from ..models.lazy import LazyParams
from ..runtime import generator
from .base import Params, moved
from .pipeline import ROTATION, canonicalize_owned, stream_rotation

CHUNK = 1 << 20  # entries drawn, perturbed and summed at a time (8 MiB in float64)
RUN_ENTRIES = 1 << 23  # a run holds about this many parameters (64 MiB in float64), at least one block
# the vocabulary-sized tensors and their vocabulary axis
VOCAB_AXIS = {"embed.W_E": 0, "unembed.W_U": 1, "unembed.b_U": 0}


def group_of(name: str) -> str:
    """The tensor group of a parameter (embeddings, attention score / output side, norms, FFN,
    router, unembedding), over which compare measures distances."""
    leaf = name.rsplit(".", 1)[-1]
    if name.startswith("embed."):
        return "embeddings"
    if name.startswith("unembed."):
        return "unembedding"
    if ".ln" in name or name.startswith("ln_"):
        return "norms"
    if ".attn." in name:
        return "attention.qk" if leaf[-1] in "QK" else "attention.vo"
    if leaf == "W_router":
        return "router"
    return "ffn"


def grouped(sq: Mapping[str, float], order: Iterable[str]) -> dict[str, float]:
    """Per tensor group, the sum of the per-tensor squared distances ``sq``, added in ``order`` (the
    parameter order): the same sums however the tensors were computed — whole, by runs of blocks,
    some in a helper process."""
    out: dict[str, float] = {}
    for k in order:
        out[group_of(k)] = out.get(group_of(k), 0.0) + sq[k]
    return out


def worst(per_probe: Iterable[Mapping[str, float]], order: Iterable[str]) -> dict[str, float]:
    """Per group, the largest of the probes' :func:`grouped` sums (the rounding response)."""
    order = list(order)
    out: dict[str, float] = {}
    for sq in per_probe:
        for g, v in grouped(sq, order).items():
            out[g] = max(out.get(g, 0.0), v)
    return out


Steps = list[tuple[str, Element]]  # (action, its part on the embeddings and head)
OWN_ROTATION = Element({}, 1.0)  # in a probe's outer steps: the probe's own stream rotation, held apart


def outer_steps(cfg_run: Config, records) -> Steps:
    """The parts of a run's steps that act on the embeddings and head (the outer tensors)."""
    steps = [(r.action, restrict(ACTIONS[r.action], cfg_run, r.element, None)) for r in records]
    return [(a, part) for a, part in steps if part is not None]


def outer_applied(cfg: Config, small: Params, name: str, chunk: torch.Tensor, steps: Steps) -> dict:
    """``steps`` on a chunk of vocabulary entries of ``name`` beside the small outer tensors
    ``small`` (a model with as many vocabulary entries as the chunk): the new tensors."""
    one = cfg.with_(n_layers=1, vocab=chunk.shape[VOCAB_AXIS[name]])
    state: dict = {**small, name: chunk}
    for action, part in steps:
        state = dict(ACTIONS[action].apply(one, state, part))
    return state


def sq_by_group(a: Params, b: Params | None = None, out: dict[str, float] | None = None) -> dict[str, float]:
    """Σ‖a − b‖² (or Σ‖a‖²) per tensor group, in float64, one tensor at a time (added to ``out``)."""
    out = {} if out is None else out
    for k, v in a.items():
        out[group_of(k)] = out.get(group_of(k), 0.0) + sq_distance(v, None if b is None else b[k])
    return out


class Spilled:
    """A float64 tensor kept in a temporary file instead of memory, read back :data:`CHUNK` entries
    at a time by :func:`sq_distance` (the same values, so the same sums): B's canonical embeddings,
    which its first run's probes are measured against, beside each probe's perturbed copy and its
    steps' results (SmolLM2: a quarter of a GB less at the peak, for one write and a read per probe
    from the page cache)."""

    def __init__(self, t: torch.Tensor):
        import tempfile

        flat = t.detach().to("cpu", torch.float64).reshape(-1)
        self.shape, self.n = tuple(t.shape), flat.numel()
        self._file = tempfile.TemporaryFile()
        for i in range(0, self.n, CHUNK):
            self._file.write(flat[i : i + CHUNK].contiguous().numpy().data)

    def chunks(self):
        self._file.seek(0)
        buf = torch.empty(min(CHUNK, self.n), dtype=torch.float64)
        for i in range(0, self.n, CHUNK):
            view = buf[: min(CHUNK, self.n - i)]
            if self._file.readinto(view.numpy().data.cast("B")) != 8 * view.numel():
                raise OSError("a temporary file came back short")
            yield view

    def tensor(self) -> torch.Tensor:
        """The tensor back, in memory."""
        out = torch.empty(self.n, dtype=torch.float64)
        for i, chunk in zip(range(0, self.n, CHUNK), self.chunks()):
            out[i : i + chunk.numel()] = chunk
        return out.reshape(self.shape)

    def close(self) -> None:
        self._file.close()


def sq_distance(a: torch.Tensor, b: torch.Tensor | Spilled | None = None) -> float:
    """‖a − b‖² (or ‖a‖²) in float64, :data:`CHUNK` entries at a time: a tensor of at most a chunk
    in one dot product, a vocabulary-sized one without its float64 difference held whole."""
    fa = a.detach().reshape(-1)
    spilled = b.chunks() if isinstance(b, Spilled) else None
    fb = b.detach().reshape(-1) if isinstance(b, torch.Tensor) else None
    total = 0.0
    for i in range(0, fa.numel(), CHUNK):
        d = fa[i : i + CHUNK].to(torch.float64)
        if spilled is not None:
            d = d - next(spilled)
        elif fb is not None:
            d = d - fb[i : i + CHUNK].to(torch.float64)
        total += float(torch.dot(d, d))
    return total


def probe_seed(seed: int, probe: int, index: int) -> int:
    """The seed of tensor ``index``'s draw (its position in the parameter order) in probe
    ``probe``: distinct for every (probe, tensor) of one seed while probes < 1000 and tensors < 10⁶."""
    return (seed * 1000 + probe) * 1_000_000 + index


def perturb_with(v: torch.Tensor, u: float, g: torch.Generator) -> torch.Tensor:
    """θ + u·|θ|⊙z, z uniform in [−1, 1] drawn from ``g`` in the order of v's entries, as a new
    float64 tensor: z = 2w − 1 for w uniform in [0, 1), computed as 2u·(w − ½)·|θ| + θ (w − ½
    and the factor 2 are exact).  :data:`CHUNK` entries at a time, so that besides the result only
    a chunk is held — a vocabulary-sized embedding would otherwise need its float64 copy, the draw
    and |θ| beside it.  The CPU generator draws serially, so the chunks' draws are the one draw's,
    and consecutive stretches of a tensor drawn with one generator are the whole tensor's draw
    (``tests/test_gauge_fix.py``)."""
    flat = v.detach().to("cpu").reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float64)
    for i in range(0, flat.numel(), CHUNK):
        x = flat[i : i + CHUNK].to(torch.float64)
        w = torch.rand(x.shape, generator=g, dtype=torch.float64).sub_(0.5)
        torch.addcmul(x, x.abs(), w, value=2.0 * u, out=out[i : i + CHUNK])
    return out.reshape(v.shape)


def perturbed(v: torch.Tensor, u: float, seed: int, axis: int = 0) -> torch.Tensor:
    """:func:`perturb_with` from ``generator(seed)``.  ``axis`` 1 (a matrix whose vocabulary axis is
    its second, the head W_U): the draws in the order of vᵀ's entries, so that a chunk of
    vocabulary entries (rows of W_E, columns of W_U) draws one contiguous stretch
    (:mod:`.comparison_by_runs` perturbs the head chunk by chunk)."""
    g = generator(seed)
    if axis == 1 and v.dim() == 2:
        return perturb_with(v.T, u, g).T.contiguous()
    return perturb_with(v, u, g)


def perturbed_param(name: str, v: torch.Tensor, u: float, seed: int) -> torch.Tensor:
    """Parameter ``name``'s perturbation (:func:`perturbed`, along its vocabulary axis)."""
    return perturbed(v, u, seed, VOCAB_AXIS.get(name, 0))


def probe_params(params: Params, u: float, seed: int, probe: int) -> Params:
    """The whole perturbed model of probe ``probe`` (the plain definition's input)."""
    return {k: perturbed_param(k, v, u, probe_seed(seed, probe, i)) for i, (k, v) in enumerate(params.items())}


def block_runs(cfg: Config, params: Params) -> list[tuple[int, int]]:
    """Consecutive runs (first block, count) of about RUN_ENTRIES parameters; parameters read on
    access are counted from their shapes, not read."""
    shapes = params.shapes if isinstance(params, LazyParams) else {k: tuple(v.shape) for k, v in params.items()}
    sizes = [0] * cfg.n_layers
    for k, shape in shapes.items():
        b = block_of(k)
        if b is not None:
            sizes[b] += math.prod(shape)
    runs, lo = [], 0
    while lo < cfg.n_layers:
        n, total = 0, 0
        while lo + n < cfg.n_layers and (n == 0 or total + sizes[lo + n] <= RUN_ENTRIES):
            total += sizes[lo + n]
            n += 1
        runs.append((lo, n))
        lo += n
    return runs


def run_slice(source: Params, names: list[str], lo: int) -> dict[str, torch.Tensor]:
    return {moved(k, -lo): source[k] for k in names}


def blockwise(cfg: Config, params: Params) -> bool:
    """Can the response be computed one run of blocks at a time (no bias-chain stretch joins two
    blocks)?"""
    return cfg.n_layers > 1 and not segments(cfg, params)


class RunProbes:
    """The probes of one model, fed one run of blocks at a time (the first run, with the outer
    tensors, before the others; the others in any order, some maybe in another process: see
    :mod:`.streamed`): per probe its squared response per tensor and the stream rotation its first
    run computed.  The one probe loop of compare, whole or fully streamed, fed by
    :class:`.streamed.Runs`.

    ``outer``: the outer tensors the first run perturbs and measures (default: every one of
    ``params``'s); ``stand_in``: tensors added to every run's input as they are (zero rows in place
    of the vocabulary-sized tensors, which are then measured chunk by chunk); ``vocab``: the runs'
    vocabulary (that of the stand-in rows); ``rotations``: a rotation per probe given in advance
    (a callable, read at each run) instead of the first run's; ``record_outer``: keep, per probe,
    its perturbed outer tensors and its steps on the embeddings and head (the rotation's part as
    :data:`OWN_ROTATION`) for the chunks."""

    def __init__(
        self,
        cfg: Config,
        params: Params,
        probes: int,
        seed: int,
        u: float,
        storage_dtype: torch.dtype,
        taken_along: Params | None = None,
        *,
        outer: list[str] | None = None,
        stand_in: Params | None = None,
        vocab: int | None = None,
        rotations: list[Element | Callable[[], Element] | None] | None = None,
        record_outer: bool = False,
    ):
        self.cfg, self.params, self.seed, self.u, self.storage_dtype = cfg, params, seed, u, storage_dtype
        self.index = {k: i for i, k in enumerate(params)}
        self.blocks: dict[int | None, list[str]] = {}
        for k in params:
            self.blocks.setdefault(block_of(k), []).append(k)
        self.outer = self.blocks.get(None, []) if outer is None else outer
        # the outer tensors that runs after the first take along (float64, any values: the steps
        # look them up, but no block's result depends on them): a canonical form's, which is in
        # memory anyway, rather than a float64 copy of the model's own
        self.taken_along = {k: (taken_along or params)[k].detach().to("cpu", torch.float64) for k in self.outer}
        self.stand_in = dict(stand_in or {})
        self.run_changes = {} if vocab is None else {"vocab": vocab}
        # per probe ‖canon(θ + δ) − canon(θ)‖² per tensor, summed per group in parameter order
        # (outer tensors first, then the blocks) whatever order the runs were taken in
        self.sq: list[dict[str, float]] = [{} for _ in range(probes)]
        self.rotations: list[Element | Callable[[], Element] | None] = list(rotations or [None] * probes)
        self.record_outer = record_outer
        self.first_outer: list[Params] = [{} for _ in range(probes)]
        self.outer_steps: list[Steps] = [[] for _ in range(probes)]

    def names(self, lo: int, n: int) -> list[str]:
        return [k for b in range(lo, lo + n) for k in self.blocks.get(b, [])]

    def held(self, j: int, lo: int, n: int) -> dict:
        """Run ``j``'s tensors as stored, and the outer ones for the first run: read once per run
        (a checkpoint read on access), not once per probe."""
        return {k: self.params[k] for k in self.names(lo, n) + (self.outer if j == 0 else [])}

    def run(
        self,
        j: int,
        lo: int,
        n: int,
        here: Params,
        ref: Params,
        base: Mapping[str, torch.Tensor | Spilled],
        base_outer: Mapping[str, torch.Tensor | Spilled],
        kept: dict[str, Element],
    ) -> None:
        """Run ``j`` (blocks lo … lo+n−1; ``here``: their tensors, and the outer ones for run 0) of
        every probe against ``base`` (the run's canonical tensors, renumbered from 0) and
        ``base_outer`` (the canonical outer tensors), with the ``kept`` permutations of the run."""
        cfg, u, seed, outer = self.cfg, self.u, self.seed, self.outer
        names = self.names(lo, n)
        sub_names = [moved(k, -lo) for k in names]
        cfg_run = cfg.with_(n_layers=n, **self.run_changes)
        for p in range(len(self.sq)):
            sub = run_slice({k: perturbed(here[k], u, probe_seed(seed, p, self.index[k])) for k in names}, names, lo)
            if j == 0:
                first = {k: perturbed_param(k, here[k], u, probe_seed(seed, p, self.index[k])) for k in outer}
                if self.record_outer:  # the steps on the head read the final norm: kept for the chunks
                    self.first_outer[p] = first
                sub.update(first)
            else:
                sub.update(self.taken_along)
            sub.update(self.stand_in)
            keep = dict(kept)
            given = self.rotations[p]
            rotation = given() if callable(given) else given
            if rotation is not None:
                keep[ROTATION] = rotation
            c = canonicalize_owned(cfg_run, sub, reference=ref, storage_dtype=self.storage_dtype, keep=keep)
            del sub
            sq = self.sq[p]
            if j == 0:
                if given is None:
                    self.rotations[p] = stream_rotation(c.records)
                for k in outer:
                    sq[k] = sq_distance(c.params[k], base_outer[k])
                if self.record_outer:
                    self.outer_steps[p] = [
                        (a, OWN_ROTATION if a == ROTATION else el) for a, el in outer_steps(cfg_run, c.records)
                    ]
            for k, s in zip(names, sub_names):
                sq[k] = sq_distance(c.params[s], base[s])
            del c

    def order(self) -> list[str]:
        """The parameter order the sums are taken in: the outer tensors, then the blocks."""
        return self.outer + [k for b in range(self.cfg.n_layers) for k in self.blocks.get(b, [])]

    def worst(self) -> dict[str, float]:
        """Per group, the largest total over the probes."""
        return worst(self.sq, self.order())
