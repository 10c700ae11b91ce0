"""Time budgets for the searches the rule checkers make (corrections, conditions, counterexamples).

A search is bounded twice.  Its *size* is bounded by limits fixed in the code (how many slots,
sample points, unknowns, polynomial degrees), so that the same seed always gives the same
report; its *time* is bounded by a :class:`Budget`, a deadline checked cooperatively between
the steps of a search (never inside one SymPy call: the steps are size-gated so that each is
short).  A search stopped by its deadline ends with what it found so far, and the checker says
so in its evidence ("no correction found within N s") — never a silent pass.

The default (:data:`CLAIM_SECONDS`) keeps one rule claim, every checker included, within about
half a minute on a 2-core machine; ``gauge-audit audit --max-minutes`` bounds the whole run and
hands each claim at most what is left of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

CLAIM_SECONDS = 30.0      # one rule claim, all checkers
SYMBOLIC_SECONDS = 20.0   # the symbolic checker's searches (the other checkers' own work is size-bounded)
# shares of the symbolic budget: the correction search may take 60 % of it, the condition search what is
# left but 10 % kept for the small counterexample (which falls back to the generic draw when cut)
SEARCH_SHARE = {"correction": 0.6, "condition": 1.0, "counterexample": 1.0}
RESERVE = {"correction": 0.1, "condition": 0.1, "counterexample": 0.0}


class BudgetSpent(Exception):
    """Raised by :meth:`Budget.check` once the deadline has passed (caught by the search)."""


@dataclass
class Budget:
    """A deadline ``seconds`` from now (None: no time limit) and the record of what it cut."""

    seconds: float | None
    start: float = field(default_factory=time.monotonic)
    cut: list[str] = field(default_factory=list)

    @property
    def deadline(self) -> float | None:
        return None if self.seconds is None else self.start + self.seconds

    def left(self) -> float | None:
        """Seconds left (None: unlimited; never negative)."""
        return None if self.seconds is None else max(0.0, self.deadline - time.monotonic())

    def spent(self) -> bool:
        return self.seconds is not None and time.monotonic() >= self.deadline

    def check(self) -> None:
        if self.spent():
            raise BudgetSpent()

    def part(self, share: float, reserve: float = 0.0) -> "Budget":
        """A sub-budget: at most ``share`` of the whole budget and what is left of it once a
        ``reserve`` share is kept for later steps; its cuts are recorded here too."""
        if self.seconds is None:
            return Budget(None, cut=self.cut)
        return Budget(max(0.0, min(share * self.seconds, self.left() - reserve * self.seconds)), cut=self.cut)

    def record(self, what: str) -> None:
        self.cut.append(what)


def unlimited() -> Budget:
    return Budget(None)


__all__ = ["Budget", "BudgetSpent", "CLAIM_SECONDS", "RESERVE", "SEARCH_SHARE", "SYMBOLIC_SECONDS", "unlimited"]
