"""Canonicalise a checkpoint whose float64 copy does not fit in memory, one run of blocks at a time.

Where gauge fixing chooses every element from one block's own tensors except the stream rotation
(chosen from the embedding), and acts on the embeddings and head only through the final norm's
scale and that rotation — RMSNorm streams without biases, learned positions or a parallel
residual: Llama, Mistral, Mixtral, Qwen3, Gemma 2/3, OLMo 2, Phi-3, SmolLM2 (:func:`streamable`
says why elsewhere) — the canonical form is computed in three parts:

1. the stream rotation from the embedding, read once: its Gram summed over chunks of rows, the
   eigenvectors, the axes' third moments summed over the same chunks (the condition and decisions
   of :func:`.stream.fix_stream_rotation`; sums in another order than the whole products', so
   equal to them up to rounding);
2. each run of blocks canonicalised as a model of its own depth
   (:func:`.pipeline.canonicalize_owned`), the rotation given and the embeddings and head replaced
   by a few zero rows (no block's element depends on them); the runs' records merged
   (:func:`.streamed.merge_runs`), every decision judged again at the whole model's κ;
3. the embeddings and head: the elements that act on them applied to chunks of vocabulary rows.

:class:`CanonicalByRuns` is the canonical form as parameters read on access.  Read in block order
(the checkpoint writer, a forward) it computes one run at a time and holds only that run, so memory
holds one run, one vocabulary-sized tensor and the elements — for Llama-3-8B one 1.75 GB block in
float64 and the 4.2 GB embedding, against 64 GB for the whole model.  Every pass computes the runs
again (the same arithmetic, the same values): a pass costs one canonicalisation.  The first pass
(:meth:`CanonicalByRuns.canonical`, or the writer's) gives the records and the conditions' residuals.
``tests/test_by_runs.py`` compares all of it with the whole-model pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..actions import Element
from ..actions.blockwise import block_of
from ..errors import GaugeAuditError
from ..models import Config, param_shapes
from ..models.lazy import LazyParams
from ..runtime import eps, matmul, one_thread, wide_products
from .base import Decision, StepRecord, gram_decisions, moved, rounding_kappa, signs_of_moments
from .pipeline import STEPS, Canonical, canonicalize_owned, conditions, rotation_index, unfixed
from .response import ROTATION, VOCAB_AXIS, block_runs, outer_applied, outer_steps
from .stream import rotates
from .streamed import merge_runs

STAND_IN = 4  # vocabulary rows the runs of blocks take along instead of the embeddings and head
CHUNK = 1 << 25  # entries of a chunk of vocabulary rows (256 MiB in float64)
# the steps a run of blocks may take: each chooses its element from the run's own tensors (the
# norm scales from the norm weights alone), and only norm-scale and the stream rotation act on the
# embeddings and head
STEPS_BY_RUNS = frozenset(
    {
        "norm-scale",
        "final-norm-scale",
        "router-offset",
        ROTATION,
        "head-perm",
        "expert-perm",
        "ffn-perm",
        "qk-gl",
        "qk-norm-scale",
        "qk-plane-turn",
        "vo-gl",
        "relu-scaling",
        "swiglu-scaling",
    }
)
OUTER_ACTIONS = frozenset({"norm-scale", ROTATION})
ROTATION_CONDITION = "embedding Gram diagonal, descending, axes signed by their third moment"


def with_rotation_decided(
    records: list[StepRecord], u: float, decisions: Callable[[Callable[[float], float]], list[Decision]]
) -> None:
    """The stream rotation's record among a merged model's ``records`` replaced by the one the
    whole model's canonicalisation makes: its condition, and ``decisions(threshold)`` — the
    rotation decided apart from the runs (from the embedding's Gram or a Procrustes fit), each
    decision's threshold ``threshold(sensitivity)`` at the κ of the dense steps before it, as
    :meth:`.base.Context.threshold` counts it."""
    i = rotation_index(records)
    assert i is not None  # called where the rotation was decided apart from the runs
    kappa = rounding_kappa(records[:i])
    r = records[i]
    found = decisions(lambda sensitivity: sensitivity * u * kappa)
    records[i] = StepRecord(r.family, r.action, r.element, ROTATION_CONDITION, found, [], r.reads, r.writes)


def streamable(cfg: Config) -> str | None:
    """None where :class:`CanonicalByRuns` applies to ``cfg``, else why not (the steps that then
    choose elements from the embeddings or couple blocks)."""
    if cfg.latent_attention:
        return "multi-head latent attention (its latent steps are not streamed yet)"
    if cfg.norm not in ("rmsnorm", "rmsnorm-noweight"):
        return f"a {cfg.norm} stream (the offset steps move the embeddings with the blocks)"
    if cfg.attn_bias or cfg.out_bias or cfg.mlp_bias or cfg.unembed_bias:
        return "biases (the bias steps move them along the stream, across blocks)"
    if cfg.pos == "learned" or cfg.n_types or cfg.embed_norm:
        return "learned position or token-type embeddings (the embedding offset step reads them)"
    if cfg.parallel_residual:
        return "a parallel residual"
    return None


def _stats(conds: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, float]]:
    return {k: (int(v.numel()), float(v.abs().max())) for k, v in conds.items()}


def _join(a: dict[str, tuple[int, float]], b: dict[str, tuple[int, float]]) -> dict[str, tuple[int, float]]:
    out = dict(a)
    for k, (n, r) in b.items():
        m, s = out.get(k, (0, 0.0))
        out[k] = (m + n, max(s, r))
    return out


class CanonicalByRuns(LazyParams):
    """The canonical form of ``params`` (float64 parameters read on access, e.g. a checkpoint's
    :meth:`~gauge_audit.models.checkpoint.Checkpoint.params`), computed one run of blocks at a
    time as it is read (module docstring).  ``progress(done, total)``: called per run computed
    (:meth:`follow` starts the count again for the next pass).  ``owned``: every read of ``params`` returns a tensor of its own (a checkpoint's
    ``params()``), in which the embeddings and head are transformed instead of in a copy (for an
    8 B model 4.2 GB less at the peak)."""

    def __init__(
        self,
        cfg: Config,
        params: Mapping,
        storage_dtype: torch.dtype,
        progress: Callable[[int, int], None] | None = None,
        owned: bool = False,
    ):
        why = streamable(cfg)
        if why is not None:
            raise GaugeAuditError(f"gauge fixing one run of blocks at a time does not support {why}")
        shapes = {n: tuple(s) for n, (s, _) in param_shapes(cfg).items()}
        super().__init__(shapes, self._load)
        self.cfg, self.src, self.storage_dtype, self.progress = cfg, params, storage_dtype, progress
        self.owned = owned
        self.blocks: dict[int, list[str]] = {}
        for k in shapes:
            b = block_of(k)
            if b is not None:
                self.blocks.setdefault(b, []).append(k)
        self.outer = [k for k in shapes if block_of(k) is None]
        self.vocab_sized = [k for k in self.outer if k in VOCAB_AXIS]
        self.runs = block_runs(cfg, self)
        # the outer tensors as they were read (small: norm weights), and the vocabulary-sized ones
        # replaced by zero rows for the runs
        self.small0 = {k: params[k].to(torch.float64) for k in self.outer if k not in VOCAB_AXIS}
        self.small = dict(self.small0)
        rows = min(cfg.vocab, STAND_IN)
        self.stand_in = {**self.small0}
        for k in self.vocab_sized:
            shape = list(shapes[k])
            shape[VOCAB_AXIS[k]] = rows
            self.stand_in[k] = torch.zeros(shape, dtype=torch.float64)
        self.records: dict[int, tuple[int, list[StepRecord]]] = {}
        self.stats: dict[str, tuple[int, float]] = {}
        self.outer_steps: list[tuple[str, Element]] | None = None  # (action, its part on the embeddings/head)
        self.embedding_gram: torch.Tensor | None = None  # of the canonical embedding, once formed
        self._run: tuple[int, dict[str, torch.Tensor]] | None = None
        self._computed = 0  # runs computed in this pass (for progress)
        self.rotation, self._axes = self._stream_rotation()
        self.keep = {ROTATION: self.rotation} if self.rotation is not None else None

    # ------------------------------------------------------------------ 1 the stream rotation
    def vocabulary_chunks(self) -> list[tuple[int, int]]:
        """(first row, rows) of the vocabulary's chunks (a row of W_E, a column of W_U: d_model
        entries each); none of a single row (a model needs two vocabulary entries)."""
        rows, v = max(2, CHUNK // self.cfg.d_model), self.cfg.vocab
        out = [(a, min(rows, v - a)) for a in range(0, v, rows)]
        if len(out) > 1 and out[-1][1] == 1:
            out[-2:] = [(out[-2][0], out[-2][1] + 1)]
        return out

    def _read(self, name: str) -> torch.Tensor:
        """``name`` as read, in float64, in a tensor of its own (the chunks are replaced in it)."""
        t = self.src[name]
        return t.to(torch.float64) if self.owned or t.dtype != torch.float64 else t.clone()

    def _stream_rotation(self) -> tuple[Element | None, tuple | None]:
        """The pipeline's stream rotation (RMSNorm: R = Q itself) from chunks of the embedding's
        rows, and what its decisions are made of: (eigenvalues, ‖W_E‖²_F, sign margins)."""
        if not rotates(self.cfg):
            return None, None
        with one_thread(), wide_products():
            # as stored: each chunk in float64 only while it is used
            w = self.src["embed.W_E"]
            d = self.cfg.d_model
            gram, sumsq = torch.zeros(d, d, dtype=torch.float64), 0.0
            for a, n in self.vocabulary_chunks():
                c = w[a : a + n].to(torch.float64)
                gram += matmul(c.T, c)
                sumsq += float((c * c).sum())
            lam, vec = torch.linalg.eigh(gram)
            lam, vec = lam.flip(0), vec.flip(1)
            cube, scale = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
            for a, n in self.vocabulary_chunks():
                y = matmul(w[a : a + n].to(torch.float64), vec)
                cube += (y**3).sum(0)
                scale += (y.abs() ** 3).sum(0)
            del w
            s, margin = signs_of_moments(cube, scale)
        return Element({"R": vec * s}, 1.0), (lam, sumsq, margin)

    # ------------------------------------------------------------------ 2 the runs of blocks
    def canonical_run(self, j: int) -> dict[str, torch.Tensor]:
        lo, n = self.runs[j]
        cfg_run = self.cfg.with_(n_layers=n, vocab=min(self.cfg.vocab, STAND_IN))
        sub = {moved(k, -lo): self.src[k].to(torch.float64) for b in range(lo, lo + n) for k in self.blocks[b]}
        sub.update(self.stand_in)
        with wide_products():
            c = canonicalize_owned(cfg_run, sub, reference=None, storage_dtype=self.storage_dtype, keep=self.keep)
        del sub
        blocks = {moved(k, lo): v for k, v in c.params.items() if block_of(k) is not None}
        if j not in self.records:
            self._record(j, lo, cfg_run, c)
        self._computed += 1
        if self.progress is not None:
            self.progress(min(self._computed, len(self.runs)), len(self.runs))
        return blocks

    def follow(self, progress: Callable[[int, int], None] | None) -> None:
        """Report the runs of the next pass (a forward over this mapping) to ``progress``."""
        self.progress, self._computed = progress, 0

    def _record(self, j: int, lo: int, cfg_run: Config, c: Canonical) -> None:
        """Run ``j``'s records and conditions, the first time it is computed; from the first run
        also the steps that act on the embeddings and head, and the canonical small outer tensors."""
        for r in c.records:
            if r.family not in STEPS_BY_RUNS:
                raise GaugeAuditError(f"gauge fixing one run of blocks at a time does not support the step {r.family}")
            if r.action not in OUTER_ACTIONS and set(r.writes) & set(self.vocab_sized):
                raise GaugeAuditError(f"{r.family} moves the embeddings or head: not canonicalised one run at a time")
        self.records[j] = (lo, c.records)
        # the conditions on this run's blocks; the first run's also on the final norm (those of
        # the stand-in embedding and head: the rotation's alone, measured on the embedding)
        params = c.params if j == 0 else {k: v for k, v in c.params.items() if block_of(k) is not None}
        self.stats = _join(self.stats, _stats(conditions(cfg_run, params, frozenset({ROTATION}))))
        if j == 0:  # the steps that act on the embeddings and head
            self.outer_steps = outer_steps(cfg_run, c.records)
            for k in self.small:  # canonical: the same elements applied to them below
                self.small[k] = c.params[k]

    def canonical(self) -> Canonical:
        """The whole model's :class:`Canonical` (``params``: this mapping): the records of every run
        merged, the rotation's decisions and the conditions' residuals (a pass over the runs not
        computed yet, and over the embedding for its Gram)."""
        for j in range(len(self.runs)):
            if j not in self.records:
                self.canonical_run(j)
        self._run = None
        merged = merge_runs(self.cfg, [self.records[j] for j in range(len(self.runs))], self.storage_dtype, True)
        if merged is None:
            raise GaugeAuditError("the runs of blocks took different steps: not canonicalised one run at a time")
        records = merged.records
        stats = dict(self.stats)
        if self._axes is not None:
            lam, sumsq, margin = self._axes

            def decisions(threshold: Callable[[float], float]) -> list[Decision]:
                def decide(kind: str, where: str, margins, sensitivity: float) -> Decision:
                    return Decision.of(kind, where, margins, threshold(sensitivity), sensitivity)

                return gram_decisions(decide, "stream rotation (embedding)", lam, sumsq, margin)

            with_rotation_decided(records, eps(self.storage_dtype) / 2, decisions)
            if self.embedding_gram is None:
                self["embed.W_E"]  # forms the canonical embedding's Gram
            assert self.embedding_gram is not None
            g = self.embedding_gram
            iu = torch.triu_indices(g.shape[0], g.shape[0], 1)
            off = g[iu[0], iu[1]]
            stats[ROTATION] = (int(off.numel()), float(off.abs().max()) if off.numel() else 0.0)
        order = [f for _, _, conds in STEPS for f in conds if f in stats]  # conditions()' order
        return Canonical(
            self.cfg,
            self,
            records,
            unfixed(self.cfg),
            self.storage_dtype,
            condition_stats={f: stats[f] for f in order},
        )

    # ------------------------------------------------------------------ 3 the embeddings and head
    def _outer(self, name: str) -> torch.Tensor:
        if self.outer_steps is None:
            self.canonical_run(0)
        assert self.outer_steps is not None
        if name not in VOCAB_AXIS:
            return self.small[name]
        axis = VOCAB_AXIS[name]
        with one_thread(), wide_products():
            t = self._read(name)
            gram = (
                torch.zeros(self.cfg.d_model, self.cfg.d_model, dtype=torch.float64)
                if name == "embed.W_E" and self.rotation is not None and self.embedding_gram is None
                else None
            )
            for a, n in self.vocabulary_chunks():
                piece = t.narrow(axis, a, n)
                piece.copy_(outer_applied(self.cfg, self.small0, name, piece.contiguous(), self.outer_steps)[name])
                if gram is not None:
                    gram += matmul(piece.T, piece)
            if gram is not None:
                self.embedding_gram = gram
        return t

    # ------------------------------------------------------------------ access
    def _load(self, name: str) -> torch.Tensor:
        b = block_of(name)
        if b is None:
            self._run = None  # past the blocks or before them: no run held beside the head
            return self._outer(name)
        j = next(i for i, (lo, n) in enumerate(self.runs) if lo <= b < lo + n)
        if self._run is None or self._run[0] != j:
            self._run = None  # the previous run freed before the next is computed
            self._run = (j, self.canonical_run(j))
        return self._run[1][name]
