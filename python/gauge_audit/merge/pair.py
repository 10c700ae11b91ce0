"""Two checkpoints to merge: same configuration (family, every shape and function-changing
option), B optionally aligned to A by an element of B's gauge group."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..align import align
from ..errors import GaugeAuditError
from ..models.checkpoint import Checkpoint, open_checkpoint
from ..models.config import Config
from .path import distance

GROUPS = ("permutation", "orthogonal", "full")


@dataclass
class Pair:
    a: Checkpoint
    cfg: Config
    params_a: dict[str, torch.Tensor]
    params_b: dict[str, torch.Tensor]  # B, or B′ = g·B when aligned
    distance_before: float  # ‖A − B‖/‖A‖
    distance: float  # ‖A − B′‖/‖A‖ (= distance_before without alignment)
    aligned: dict | None = None  # group, stages, seconds (None: not aligned)
    element: object = field(default=None, repr=False)


def same_config(cfg_a: Config, cfg_b: Config, name_a: str, name_b: str) -> None:
    """One line naming the first option in which the two configurations differ."""
    if cfg_a == cfg_b:
        return
    for f in dataclasses.fields(cfg_a):
        va, vb = getattr(cfg_a, f.name), getattr(cfg_b, f.name)
        if va != vb:
            raise GaugeAuditError(
                f"{name_a} and {name_b} differ in {f.name} ({va!r} vs {vb!r}): only models of one "
                f"architecture and shape can be merged"
            )


def open_pair(
    path_a: str | Path,
    path_b: str | Path,
    *,
    group: str | None = None,
    data: torch.Tensor | None = None,
    seed: int = 0,
    max_seconds: float = 120.0,
    progress: Callable | None = None,
) -> Pair:
    """Read A and B (float64, resident), check they share a configuration, and with ``group``
    align B to A (``data``: token ids for activation matching; None: weight matching)."""
    ca, cb = open_checkpoint(path_a), open_checkpoint(path_b)
    same_config(ca.cfg, cb.cfg, str(path_a), str(path_b))
    pa = {k: v.double() for k, v in ca.params(resident=True).items()}
    pb = {k: v.double() for k, v in cb.params(resident=True).items()}
    before = distance(pa, pb)
    pair = Pair(ca, ca.cfg, pa, pb, before, before)
    if group is None:
        return pair
    return align_pair(pair, group, data=data, seed=seed, max_seconds=max_seconds, progress=progress)


def align_pair(
    pair: Pair,
    group: str,
    *,
    data: torch.Tensor | None = None,
    seed: int = 0,
    max_seconds: float = 120.0,
    progress: Callable | None = None,
) -> Pair:
    """The pair with B replaced by B′ = g·B, g from ``group`` (weight matching, or activation
    matching on the token ids ``data``), under ``max_seconds`` of alignment time."""
    if group not in GROUPS:
        raise GaugeAuditError(f"unknown group {group!r} (known: {', '.join(GROUPS)})")
    t0 = time.process_time()
    res = align(
        pair.cfg,
        pair.params_a,
        pair.params_b,
        group=group,
        data=data,
        seed=seed,
        max_seconds=max_seconds,
        progress=progress,
    )
    pb2 = {k: v.double() for k, v in res.params.items()}
    info = {
        "group": group,
        "matching": "activation" if data is not None else "weight",
        "seed": seed,
        "cpu_seconds": time.process_time() - t0,
        "stages": [[stage, dict(d)] for stage, d in res.stages],
        "total_before": res.total_before,
        "total_after": res.total_after,
        "iterations": res.iterations,
        "stopped": res.stopped,
        "kappa": res.kappa,
    }
    return Pair(
        pair.a, pair.cfg, pair.params_a, pb2, pair.distance_before, distance(pair.params_a, pb2), info, res.element
    )
