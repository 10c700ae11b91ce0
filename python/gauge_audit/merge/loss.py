"""Held-out loss along the path and the barrier.

Tokens: a ``.npy`` file of integer token ids (any tokeniser; 2-D read row by row), or any other file read as
plain text and tokenised at the byte level like the models of ``gauge_audit.training`` (token id
= UTF-8 byte; needs a vocabulary of at least 256).  The loss is the mean next-token
cross-entropy in nats, computed in float64 by the family's own forward, over ``windows``
non-overlapping windows of ``context`` tokens spread evenly over the file.

The barrier (Frankle et al. 2020; Theus et al. 2025 report the same quantity) is
    B = max_t [ L(t) − ((1 − t)·L(0) + t·L(1)) ]
over the evaluated points; it is 0 for a model with itself and can be negative only by the
amount a merged model beats the chord.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.families import family_of
from ..training import corpus
from .path import interpolate


def load_tokens(path: str | Path, cfg: Config) -> np.ndarray:
    """Token ids of ``path`` (module docstring), checked against ``cfg.vocab``."""
    return corpus.load_tokens(path, cfg.vocab)


def windows(ids: np.ndarray, context: int, count: int) -> torch.Tensor:
    """``count`` (or fewer) non-overlapping windows of ``context + 1`` tokens, evenly spread."""
    total = (len(ids) - 1) // context
    if total < 1:
        raise GaugeAuditError(f"need at least {context + 1} tokens for one window of {context}, got {len(ids)}")
    starts = np.unique(np.linspace(0, total - 1, min(count, total)).round().astype(np.int64)) * context
    idx = starts[:, None] + np.arange(context + 1)[None, :]
    return torch.from_numpy(ids[idx])


def mean_loss(cfg: Config, params: Mapping[str, torch.Tensor], win: torch.Tensor, batch: int = 16) -> float:
    """Mean next-token cross-entropy (nats) of ``params`` on the windows, float64."""
    family = family_of(cfg)
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(win), batch):
            w = win[i : i + batch]
            logits = family.forward(params, cfg, {"tokens": w[:, :-1]}).double()
            total += float(
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum"
                )
            )
    return total / (win.shape[0] * (win.shape[1] - 1))


@dataclass
class BarrierCurve:
    ts: list[float]
    losses: list[float]

    @property
    def excess(self) -> list[float]:
        """L(t) minus the chord between the end losses."""
        l0, l1 = self.losses[0], self.losses[-1]
        return [lt - ((1 - t) * l0 + t * l1) for t, lt in zip(self.ts, self.losses)]

    @property
    def barrier(self) -> float:
        return max(self.excess)

    @property
    def t_max(self) -> float:
        ex = self.excess
        return self.ts[ex.index(max(ex))]

    def to_json(self) -> dict:
        return {"t": self.ts, "loss": self.losses, "barrier": self.barrier, "t_max": self.t_max}


def path_points(points: int) -> list[float]:
    if points < 3:
        raise GaugeAuditError("--points must be at least 3 (the two ends and one interior point)")
    return [i / (points - 1) for i in range(points)]


def barrier_curve(
    cfg: Config,
    a: Mapping[str, torch.Tensor],
    b: Mapping[str, torch.Tensor],
    win: torch.Tensor,
    ts: Sequence[float],
    progress: Callable[[int, int], None] | None = None,
) -> BarrierCurve:
    """Loss at each t of ``ts`` (which must start at 0 and end at 1) on the path A → B."""
    if ts[0] != 0 or ts[-1] != 1:
        raise ValueError("the path must include both ends (t = 0 and t = 1)")
    losses = []
    for k, t in enumerate(ts, 1):
        losses.append(mean_loss(cfg, interpolate(a, b, t), win))
        if progress is not None:
            progress(k, len(ts))
    return BarrierCurve(list(ts), losses)
