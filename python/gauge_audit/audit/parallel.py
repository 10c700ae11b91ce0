"""The audit over several processes: the same checks and the same report, in less wall time.

The work is cut into *units* that share what they compute and nothing else:

* every torch check (model, action) of one real checkpoint — its weights are read and
  dequantized once, in one process (the untied SmolLM2 copy goes with SmolLM2) — and one unit
  for the small random models;
* the Lean checks (one ``lake build``), the nullity checks (they share the analysed
  configurations), the claims of the float error study, all the checkers of a rule claim (they
  share its SymPy decision);
* every other (claim, checker) step on its own.

Worker processes take units from one queue, the real checkpoints first, and send back evidence, check results and what
the report plots.  The parent then assembles each claim's torch evidence from the prefetched
checks, in catalog order.

Every check is a deterministic function of the seed (one intra-op thread, seeded draws, caches
that only keep results), so which process runs a unit, and when, changes nothing in
report.json; ``tests/test_audit_parallel.py`` compares it byte for byte with a serial run.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import queue
import time
import traceback
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..claims import Claim
from ..errors import GaugeAuditError
from ..models import config_of, parameter_count
from ..models.registry import REAL, UNTIED, release
from ..runtime import keep_freed_memory, release_freed_memory, reproducible
from .checkers import Context, torch_pairs
from .dispatch import run_check, step_line
from .evidence import Evidence
from .plots import report_state
from .rule_checks import DEADLINE_KEY, SECONDS_KEY

MAX_JOBS = 8  # beyond this the units of the catalog no longer split the time (and memory adds up)
SMALL = "small models"
POLL_SECONDS = 0.5  # how often the parent looks for a worker that died without a word


def _proxy(d: dict) -> MappingProxyType:
    return MappingProxyType(d)


class _Pickler(pickle.Pickler):
    """Everything between the processes travels by value: plain pickles (not torch's shared-memory
    handles for tensors, which end with the worker that made them), a claim's read-only
    parameter mappings included."""

    def reducer_override(self, obj):
        if type(obj) is MappingProxyType:
            return _proxy, (dict(obj),)
        return NotImplemented


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


@dataclass(frozen=True)
class Unit:
    label: str
    pairs: tuple[tuple[str, str], ...] = ()  # torch checks (model, action) measured ahead
    tasks: tuple[tuple[int, str], ...] = ()  # (claim index, checker) steps


@dataclass
class Plan:
    units: list[Unit]
    # torch steps assembled in the parent from prefetched checks: (claim index, checker) → pairs
    assembled: dict[tuple[int, str], list[tuple[str, str]]]


@dataclass
class Ahead:
    """What the workers computed: evidence per (claim index, checker) with its seconds, the units'
    seconds, and the assembled steps whose checks all arrived."""

    evidence: dict[tuple[int, str], tuple[Evidence, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    ready: set[tuple[int, str]] = field(default_factory=set)


def _group(claim: Claim, name: str) -> str | None:
    """The unit a (claim, checker) step shares with others, or None (a unit of its own)."""
    if claim.rule is not None:
        return f"rule {claim.file}:{claim.id}"
    if name in ("lean", "nullity"):
        return name
    if name == "precision":
        from ..precision.verdicts import STUDY_CLAIMS

        if claim.id in STUDY_CLAIMS:
            return "error study"
    return None


def _checkpoint(model: str) -> str:
    """Which unit measures a model's checks: its real checkpoint, or the small models."""
    base = UNTIED.get(model, model)
    return base if base in REAL else SMALL


def plan(claims: list[Claim]) -> Plan:
    pairs: dict[str, dict[tuple[str, str], None]] = {}  # unit → ordered set of checks
    grouped: dict[str, list[tuple[int, str]]] = {}
    singles: list[Unit] = []
    assembled: dict[tuple[int, str], list[tuple[str, str]]] = {}
    for i, claim in enumerate(claims):
        for name in claim.checkers:
            if name == "torch" and claim.rule is None:
                try:
                    needed = torch_pairs(claim)
                except GaugeAuditError:  # the checker itself reports it, at once
                    needed = []
                if needed is not None:
                    assembled[i, name] = needed
                    for m, a in needed:
                        pairs.setdefault(_checkpoint(m), {})[m, a] = None
                    continue
            key = _group(claim, name)
            if key is None:
                singles.append(Unit(f"{claim.id}/{name}", tasks=((i, name),)))
            else:
                grouped.setdefault(key, []).append((i, name))

    def weight(label: str) -> int:
        # a checkpoint's cost grows with its size: reading it, then a forward or two per check
        if label == SMALL:
            return 0
        return parameter_count(config_of(label)) * (3 + len(pairs[label]))

    real = sorted((k for k in pairs if k != SMALL), key=weight, reverse=True)
    units = [Unit(k, pairs=tuple(pairs[k])) for k in real]
    if SMALL in pairs:
        units.append(Unit(SMALL, pairs=tuple(pairs[SMALL])))
    units += [Unit(k, tasks=tuple(v)) for k, v in grouped.items()]
    return Plan(units + singles, assembled)


def default_jobs(p: Plan, claims: list[Claim]) -> int:
    """Worker processes for an audit of ``claims`` (planned as ``p``): one per usable core (at most
    MAX_JOBS) when a real checkpoint or a good number of steps is involved; 1 (this process alone)
    for a few small steps, which would not repay starting the workers."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    heavy = any(u.label in REAL for u in p.units) or sum(len(c.checkers) for c in claims) >= 24
    return max(1, min(cores, MAX_JOBS, len(p.units))) if heavy else 1


def _start_method(device: str) -> str:
    """``fork`` for CPU work where the platform has it: the workers start at once, with the
    modules already imported (torch resets its thread pools in a forked child, as its DataLoader
    relies on); ``spawn`` otherwise — CUDA cannot be forked once initialised."""
    if device == "cpu" and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def run(
    claims: list[Claim], ctx: Context, jobs: int, progress, deadline: float | None, max_minutes: float | None
) -> Ahead:
    """Run the plan's units on ``jobs`` worker processes (0: :func:`default_jobs`); fill ``ctx``
    (checks, refusals, what the report plots) and return the workers' evidence — nothing where one
    process is the choice (the caller runs every step itself)."""
    p = plan(claims)
    jobs = jobs or default_jobs(p, claims)
    if jobs <= 1:
        return Ahead()
    mp: Any = multiprocessing.get_context(_start_method(ctx.device))  # (typeshed's BaseContext lacks Process)
    units, results = mp.Queue(), mp.Queue()
    for u in p.units:
        units.put(u)
    settings = {k: v for k, v in ctx.cache.items() if k in (SECONDS_KEY, DEADLINE_KEY)}
    workers = [
        mp.Process(
            target=_worker,
            args=(_dumps(claims), ctx.seed, ctx.device, ctx.full, settings, deadline, max_minutes, units, results),
            name=f"gauge-audit-worker-{k}",
            daemon=True,
        )
        for k in range(min(jobs, len(p.units)))
    ]
    for _ in workers:
        units.put(None)
    if _start_method(ctx.device) == "fork":
        release_freed_memory()  # a fork copies the page table of every resident page, free ones too
    for w in workers:
        w.start()
    ahead = Ahead()
    try:
        _collect(claims, ctx, workers, results, progress, ahead)
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
            w.join()
    for step, needed in p.assembled.items():
        if all(pair in ctx.checks or pair in ctx.refused for pair in needed):
            ahead.ready.add(step)
    return ahead


def _collect(claims, ctx: Context, workers, results, progress, ahead: Ahead) -> None:
    finished, quiet = 0, 0
    while finished < len(workers):
        try:
            msg = pickle.loads(results.get(timeout=POLL_SECONDS))
        except queue.Empty:
            # a worker that ended has flushed what it sent: two quiet polls after its end mean
            # it died without reporting (killed, out of memory)
            dead = [w for w in workers if not w.is_alive() and w.exitcode != 0]
            quiet = quiet + 1 if dead else 0
            if quiet >= 2:
                raise GaugeAuditError(
                    f"an audit worker process ended with exit code {dead[0].exitcode} before its work was done "
                    "(out of memory?); rerun with --jobs 1"
                ) from None
            continue
        kind = msg[0]
        if kind == "check":
            ctx.checks[msg[1]] = msg[2]
        elif kind == "refused":
            ctx.refused[msg[1]] = msg[2]
        elif kind == "start" and progress:
            progress.start(claims[msg[1]].id, msg[2])
        elif kind == "unit" and progress:
            progress.start(msg[1], "torch")
        elif kind == "done":
            _, i, name, ev, dt = msg
            ahead.evidence[i, name] = (ev, dt)
            if progress:
                progress.done(step_line(i + 1, len(claims), claims[i].id, name, ev, dt))
        elif kind == "unit-done":
            ahead.seconds[f"unit {msg[1]}"] = round(msg[2], 3)
        elif kind == "state":
            ctx.cache.update(msg[1])
        elif kind == "exit":
            finished += 1
        elif kind == "crash":
            raise RuntimeError(f"an audit worker process failed:\n{msg[1]}")


def _worker(claims, seed, device, full, settings, deadline, max_minutes, units, out) -> None:
    claims = pickle.loads(claims)
    results = _Sender(out)
    ctx = Context(seed=seed, device=device, full=full)
    ctx.cache.update(settings)
    keep_freed_memory()
    try:
        with reproducible():
            while (unit := units.get()) is not None:
                _run_unit(unit, claims, ctx, deadline, max_minutes, results)
        results.put(("state", report_state(ctx.cache)))
    except BaseException:  # reported to the parent, which stops the audit with it
        results.put(("crash", traceback.format_exc()))
        return
    results.put(("exit",))


class _Sender:
    """A worker's end of the results queue: every message a plain pickle (see :class:`_Pickler`)."""

    def __init__(self, out):
        self._out = out

    def put(self, msg: tuple) -> None:
        self._out.put(_dumps(msg))


def _run_unit(unit: Unit, claims, ctx: Context, deadline, max_minutes, results) -> None:
    if unit.pairs:
        results.put(("unit", unit.label))
        t = time.perf_counter()
        for m, a in unit.pairs:
            if deadline is not None and time.monotonic() >= deadline:
                break  # the parent's step then says NOT-RUN
            try:
                results.put(("check", (m, a), ctx.check(m, a)))
            except GaugeAuditError as exc:
                results.put(("refused", (m, a), exc.lines))
        # this unit was the checkpoint's only reader: free its weights for what comes next
        for m in {m for m, _ in unit.pairs}:
            ctx.models.pop(m, None)
            release(m)
        results.put(("unit-done", unit.label, time.perf_counter() - t))
    for i, name in unit.tasks:
        results.put(("start", i, name))
        t = time.perf_counter()
        ev = run_check(name, claims[i], ctx, deadline, max_minutes)
        results.put(("done", i, name, ev, time.perf_counter() - t))
