"""The alignment loop: B' = g·B for an element g of B's gauge group chosen to bring B' close to A.

Stages, in order (those the group and the architecture have):

  stream      fold the norm weights (γ = 1), rotate the residual stream by the Procrustes fit of
              every tensor it moves, give the norms A's weights (norm-scale, stream-rotation,
              norm-scale; full group, pre-norm families whose norms allow the rotation; from the
              second iteration on the norms get B's weights back instead) —
  norms       — or, where the stream cannot rotate, only A's norm weights (norm-scale)
  attention   KV groups and query heads matched (head-perm), then per KV group M in GL(d_k),
              O(d_k) or their RoPE commutants (qk-gl) — under a QK-norm the per-plane scaling of
              its weights instead (qk-norm-scale, full group) — and N in GL(d_v) or O(d_v) (vo-gl)
  ffn         experts matched by their router columns (expert-perm), hidden units matched
              (ffn-perm), per unit the optimal rescaling (relu-/swiglu-scaling; full group)
  offsets     the translations, each by its closed-form least squares (writer-ones,
              key-bias-shift, value-bias-fold, norm-shift; full group, where they apply)
  norm-scale  per norm coordinate the optimal scale (norm-scale; full group)

Every stage computes its element on the current B', applies it with its action (an exact group
action: B's function is kept by construction, and certified by the callers) and is kept only if
the total squared distance ‖A − B'‖² falls; the stages are repeated until an iteration lowers it
by less than a relative 10⁻⁶ (of ‖A − B'‖²), for at most ``MAX_ITERATIONS`` iterations and ``max_seconds``
(the assignments stop and complete greedily at the deadline; the result says which bound ended
it).  The first iteration's stream rotation sees only what no permutation moves (embeddings,
final norm, unembedding); later ones every tensor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..actions import ACTIONS, Element, composite
from ..actions.algebra import compose
from ..errors import GaugeAuditError
from ..gauge_fix.base import DIAGONAL
from ..gauge_fix.comparison import relative_distances, sq_by_group
from ..gauge_fix.pipeline import storage_dtype_of, validate
from ..models.config import Config
from ..runtime import one_thread
from . import continuous, matching, translations
from .activations import Activations

GROUPS = ("permutation", "orthogonal", "full")
VO_GROUPS = ("gl", "orthogonal")
MAX_ITERATIONS = 40  # the translations converge linearly with the GL fits: allow them the iterations
RELATIVE_PROGRESS = 1e-4
# diagonal scalings and permutations keep every entry's relative rounding (gauge_fix.base.DIAGONAL;
# qk-norm-scale scales norm weights entry by entry as well)
NON_AMPLIFYING = DIAGONAL | {"qk-norm-scale"}

Stage = tuple[str, dict[str, float]]


@dataclass
class Alignment:
    """The result of :func:`align`: B' (``params``, B's keys and dtypes), the composite element g
    with B' = g·B (``element``), the distances ‖A − B'‖/‖A‖ per tensor group (and "total")
    before the first stage and after each (``stages``), and how the loop ended."""

    cfg: Config
    params: dict[str, torch.Tensor]
    element: Element
    stages: list[Stage]
    total_before: float
    total_after: float
    group: str
    vo_group: str
    matching: str  # weights | activations
    iterations: int
    stopped: str  # converged | iterations | time
    seconds: float
    log: list[dict] = field(default_factory=list)  # per stage: accepted, what it matched
    notes: list[str] = field(default_factory=list)

    @property
    def kappa(self) -> float:
        return self.element.kappa

    @property
    def rounding_kappa(self) -> float:
        """κ of the steps that can amplify rounding (dense ones; diagonal scalings and
        permutations keep relative rounding): what the function check's tolerance uses."""
        return math.prod(el.kappa for a, el in composite.steps(self.element) if a not in NON_AMPLIFYING)

    def to_json(self) -> dict:
        return {
            "group": self.group,
            "vo_group": self.vo_group,
            "matching": self.matching,
            "iterations": self.iterations,
            "stopped": self.stopped,
            "seconds": self.seconds,
            "total_before": self.total_before,
            "total_after": self.total_after,
            "kappa": self.kappa,
            "rounding_kappa": self.rounding_kappa,
            "element_steps": [a for a, _ in composite.steps(self.element)],
            "stages": [{"stage": n, "distances": d} for n, d in self.stages],
            "log": self.log,
            "notes": self.notes,
        }


def _applies(action: str, cfg: Config) -> bool:
    act = ACTIONS[action]
    return act.applies(cfg) is None and act.expected_holds(cfg)


def stage_names(cfg: Config, group: str) -> list[str]:
    """The stages the group has on this architecture (module docstring)."""
    full = group == "full"
    out = []
    if full and _applies("stream-rotation", cfg):
        out.append("stream")
    elif full and _applies("norm-scale", cfg):
        out.append("norms")
    if cfg.n_heads > 1 or group != "permutation":
        out.append("attention")
    if (_applies("ffn-perm", cfg) and (cfg.d_ff > 1 or cfg.experts > 1)) or (full and _scaling(cfg)):
        out.append("ffn")
    if full and translations.applicable(cfg):
        out.append("offsets")
    if full and _applies("norm-scale", cfg):
        out.append("norm-scale")
    return out


def _scaling(cfg: Config) -> str | None:
    for name in ("relu-scaling", "swiglu-scaling"):
        if _applies(name, cfg):
            return name
    return None


class _Run:
    """One alignment in progress: A, the current B' (float64, a dict of its own), the applied
    steps and the distance so far."""

    def __init__(self, cfg, a, b, group, vo_group, deadline, acts, unit: float):
        self.cfg, self.a, self.cur = cfg, a, b
        self.group, self.vo_group, self.deadline, self.acts = group, vo_group, deadline, acts
        # relative rounding of the stored values and of the float64 arithmetic
        self.unit = unit + 64 * torch.finfo(torch.float64).eps
        self.steps: list[tuple[str, Element]] = []
        self.den = sum(sq_by_group(a).values())
        self.sq = sum(sq_by_group(b, a).values())
        # below this squared distance B' equals A to the rounding of B's storage (and of the
        # float64 arithmetic): nothing is left to align that the stored values could show
        self.floor = self.unit**2 * self.den

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    # --- stage elements: each returns [(action, element)] computed step by step on the current B'
    def stage(self, name: str, iteration: int) -> tuple[tuple[list[tuple[str, Element]], dict], dict]:
        """(steps, B' after them, what the stage matched).  A matching is judged together with
        the continuous fits after it (a permuted head still differs by its GL element, so the
        permutation alone may not lower the distance): with and without it, the better."""
        cfg, a = self.cfg, self.a
        if name in ("stream", "norms"):
            # the first time the norms take A's weights (exact on B's orbit through A); later the
            # rotation alone is refitted (B's weights back), the norm-scale stage tunes them
            target = self.a if iteration == 0 else self.cur
            unfold = lambda p, _: ("norm-scale", continuous.unfold_to(cfg, p, target))  # noqa: E731
            return self._run(self.cur, [self._fold, self._rotate(iteration), unfold]), {}
        if name == "norm-scale":
            return self._run(self.cur, [lambda p, _: ("norm-scale", continuous.norm_scale(cfg, p, a))]), {}
        if name == "offsets":
            builders = [
                (lambda p, _, act=act: (act, translations.element(act, cfg, p, a)))
                for act in translations.applicable(cfg)
            ]
            return self._run(self.cur, builders), {}
        if name == "attention":
            match, fits = [self._heads] if cfg.n_heads > 1 else [], self._attention_fits()
        else:
            match, fits = [self._experts] if cfg.experts > 1 else [], []
            match += [self._units] if _applies("ffn-perm", cfg) and cfg.d_ff > 1 else []
            fits = [self._unit_scale] if self.group == "full" and _scaling(cfg) else []
        info: dict = {}
        steps, p = self._run(self.cur, match + fits, info)
        moved = any(v for k, v in info.items() if k.endswith(" moved"))
        sq = sum(sq_by_group(p, a).values())
        if match and fits and moved and sq > self.floor:  # (at the floor nothing can be better)
            alt_steps, alt = self._run(self.cur, fits)
            if sum(sq_by_group(alt, a).values()) < sq:
                return (alt_steps, alt), {**info, "matching": "identity kept (lower after the fits)"}
        return (steps, p), info

    def _run(self, p, builders, info: dict | None = None) -> tuple[list[tuple[str, Element]], dict]:
        """Apply each builder's element in turn (a builder: (B', info) → (action, element or None))."""
        info = {} if info is None else info
        out: list[tuple[str, Element]] = []
        for build in builders:
            action, el = build(p, info)
            if el is None:
                continue
            p = ACTIONS[action].apply(self.cfg, p, el)
            out.append((action, el))
        return out, p

    def _fold(self, p, _):
        return "norm-scale", continuous.fold(self.cfg, p) if _applies("stream-rotation", self.cfg) else None

    def _rotate(self, iteration: int):
        def build(p, _):
            if not _applies("stream-rotation", self.cfg):
                return "stream-rotation", None
            return "stream-rotation", continuous.rotation(self.cfg, p, self.a, all_tensors=iteration > 0)

        return build

    def _heads(self, p, info):
        log = matching.MatchLog()
        mode = "weights" if self.group == "permutation" else "products"
        if self.acts is not None:
            costs = self.acts.head_costs(p)
        else:
            costs = [matching.head_costs(self.cfg, p, self.a, layer, mode) for layer in range(self.cfg.n_layers)]
        el = matching.match_heads(self.cfg, costs, log, self.deadline)
        info.update(_match_info(log, "heads"))
        return "head-perm", el

    def _attention_fits(self):
        cfg, a = self.cfg, self.a
        if self.group == "permutation":
            return []
        out = []
        if _applies("qk-gl", cfg):
            orth = self.group == "orthogonal"
            out.append(lambda p, _: ("qk-gl", continuous.gl_pairs(cfg, p, a, "M", orth, self.unit**2)))
        elif self.group == "full" and _applies("qk-norm-scale", cfg):
            out.append(lambda p, _: ("qk-norm-scale", continuous.qk_norm_scale(cfg, p, a)))
        orth_vo = self.group == "orthogonal" or self.vo_group == "orthogonal"
        out.append(lambda p, _: ("vo-gl", continuous.gl_pairs(cfg, p, a, "N", orth_vo, self.unit**2)))
        return out

    def _experts(self, p, info):
        log = matching.MatchLog()
        costs = [matching.expert_cost(self.cfg, p, self.a, layer) for layer in range(self.cfg.n_layers)]
        el = matching.match_experts(self.cfg, costs, log, self.deadline)
        info.update(_match_info(log, "experts", info))
        return "expert-perm", el

    def _units(self, p, info):
        cfg, log = self.cfg, matching.MatchLog()
        mode = "rank-one" if self.group == "full" and _scaling(cfg) else "weights"
        if self.acts is not None:
            costs = self.acts.unit_costs(p)
        else:
            costs = [
                [
                    matching.unit_cost(cfg, p, self.a, matching.ffn_prefix(cfg, layer), e, mode)
                    for e in (range(cfg.experts) if cfg.experts else [None])
                ]
                for layer in range(cfg.n_layers)
            ]
        el = matching.match_units(cfg, costs, log, self.deadline)
        info.update(_match_info(log, "hidden units", info))
        return "ffn-perm", el

    def _unit_scale(self, p, _):
        action = _scaling(self.cfg)
        assert action is not None  # only where a scaling applies
        return action, continuous.unit_scaling(self.cfg, p, self.a, positive=action == "relu-scaling")


def _match_info(log: matching.MatchLog, what: str, before: dict | None = None) -> dict:
    """What a matching found, added to what the stage's earlier matchings found."""
    info = {f"{what} moved": log.moved, f"{what} assignments": log.problems}
    if log.greedy:
        info[f"{what} greedy"] = log.greedy  # assignments completed greedily at the deadline
    return info


def _merged(steps: list[tuple[str, Element]]) -> list[tuple[str, Element]]:
    """Adjacent steps of one action become one (its group law)."""
    out: list[tuple[str, Element]] = []
    for action, el in steps:
        if out and out[-1][0] == action:
            out[-1] = (action, compose(action, out[-1][1], el))
        else:
            out.append((action, el))
    return out


def _distances(a, b) -> dict[str, float]:
    total, per = relative_distances(a, b)
    return {**per, "total": total}


def align(
    cfg: Config,
    params_a,
    params_b,
    *,
    group: str = "full",
    data: torch.Tensor | None = None,
    seed: int = 0,
    max_seconds: float = 120.0,
    progress: Callable[[str], None] | None = None,
    vo_group: str = "gl",
) -> Alignment:
    """B' = g·B close to A (module docstring).  ``group``: "permutation" (heads, KV groups, FFN
    units, experts), "orthogonal" (+ one orthogonal matrix per KV group for QK and for VO; on
    the RoPE commutant under RoPE), "full" (the whole group the architecture has, see
    :func:`stage_names`; ``vo_group`` "orthogonal" keeps VO orthogonal).  ``data``: token ids
    (batch, seq): heads and units are matched by the correlations of their activations on it
    instead of by their weights.  ``seed``: the draw of the data positions used when there are
    more than the activation budget allows."""
    if group not in GROUPS:
        raise GaugeAuditError(f"unknown group {group!r}; known: {', '.join(GROUPS)}")
    if vo_group not in VO_GROUPS:
        raise GaugeAuditError(f"unknown VO group {vo_group!r}; known: {', '.join(VO_GROUPS)}")
    if not (max_seconds > 0 and math.isfinite(max_seconds)):
        raise GaugeAuditError("max_seconds must be a finite number > 0")
    validate(cfg, params_a)
    validate(cfg, params_b)
    say = progress or (lambda line: None)
    t0 = time.monotonic()
    with one_thread():
        a = {k: v.detach().to("cpu", torch.float64) for k, v in params_a.items()}
        b = {k: v.detach().to("cpu", torch.float64) for k, v in params_b.items()}
        acts = None
        if data is not None:
            acts = Activations(cfg, a, data, seed)
        unit = torch.finfo(storage_dtype_of(params_b)).eps / 2
        run = _Run(cfg, a, b, group, vo_group, t0 + max_seconds, acts, unit)
        names = stage_names(cfg, group)
        stages: list[Stage] = [("before", _distances(a, b))]
        log: list[dict] = []
        stopped, iterations = "iterations", 0
        for it in range(MAX_ITERATIONS):
            start = run.sq
            for name in names:
                if run.out_of_time():
                    break
                (steps, new), info = run.stage(name, it)
                sq = sum(sq_by_group(new, a).values())
                kept = bool(steps) and sq < run.sq
                if kept:
                    run.cur, run.sq = new, sq
                    run.steps += steps
                label = f"{name} {it + 1}"
                stages.append((label, _distances(a, run.cur)))
                log.append({"stage": label, "kept": kept, **info})
                say(
                    f"align: {label}: ‖A − B'‖/‖A‖ = {math.sqrt(run.sq / run.den):.4e}" + ("" if kept else " (kept B')")
                )
            iterations = it + 1
            if run.out_of_time():
                stopped = "time"
                break
            if run.sq <= run.floor or start - run.sq <= RELATIVE_PROGRESS * start:
                stopped = "converged"
                break
        element = composite.make(_merged(run.steps))
        out = {k: run.cur[k].to(params_b[k].dtype) for k in params_b}
    notes = []
    if any(e.get("greedy") for e in log):
        notes.append("the time budget ran out inside an assignment: its remaining items were matched greedily")
    if group == "full" and cfg.qk_norm != "none":
        notes.append("QK-norm: the query–key GL is not a symmetry; only the per-plane scaling of the norm weights is")
    return Alignment(
        cfg,
        out,
        element,
        stages,
        stages[0][1]["total"],
        stages[-1][1]["total"],
        group,
        vo_group,
        "activations" if data is not None else "weights",
        iterations,
        stopped,
        time.monotonic() - t0,
        log,
        notes,
    )
