"""The experiment registry and the result every experiment returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

HOLDS, FAILS, CORRECTED, UNDECIDED = "HOLDS", "FAILS", "HOLDS-WITH-CORRECTION", "UNDECIDED"


@dataclass
class Finding:
    """What an experiment measured: ``outcome`` (HOLDS, FAILS, HOLDS-WITH-CORRECTION or UNDECIDED),
    a one-line ``summary`` with the deciding numbers, and the numbers themselves in ``details``."""

    outcome: str
    summary: str
    details: dict = field(default_factory=dict)
    corrected_rule: str | None = None
    counterexample: str | None = None

    def __post_init__(self):
        if self.outcome not in (HOLDS, FAILS, CORRECTED, UNDECIDED):
            raise ValueError(f"bad outcome {self.outcome!r}")


#: claim id -> fn(seed, full) -> Finding
EXPERIMENTS: dict[str, Callable[[int, bool], Finding]] = {}


def experiment(claim_id: str):
    """Register ``fn(seed, full)`` as the experiment deciding ``claim_id``."""

    def deco(fn):
        EXPERIMENTS[claim_id] = fn
        return fn

    return deco
