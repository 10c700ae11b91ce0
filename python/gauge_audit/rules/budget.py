"""Time budgets for the searches the rule checkers make (corrections, conditions, counterexamples).

A search is bounded twice.  Its *size* is bounded by limits fixed in the code (how many slots,
sample points, unknowns, polynomial degrees), so that the same seed always gives the same
report; its *time* is bounded by a :class:`Budget` of CPU seconds (and the audit's wall-clock
deadline, if any), checked cooperatively between the steps of a search (never inside one SymPy
call: the steps are size-gated so that each is short).  A search stopped by its deadline ends with what it found so far, and the checker says
so in its evidence ("no correction found within N s") — never a silent pass.

The default (:data:`CLAIM_SECONDS`) keeps one rule claim, every checker included, within about
half a minute on a 2-core machine; ``gauge-audit audit --max-minutes`` bounds the whole run and
hands each claim at most what is left of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

CLAIM_SECONDS = 30.0  # one rule claim, all checkers
SYMBOLIC_SECONDS = 20.0  # the symbolic checker's searches (the other checkers' own work is size-bounded)
# shares of the symbolic budget: the correction and nearest-statement searches may take 80 % of it
# together, the condition search what is left but 10 % kept for the small counterexample (which
# falls back to the generic draw when cut)
SEARCH_SHARE = {"correction": 0.8, "condition": 1.0, "counterexample": 1.0}
RESERVE = {"correction": 0.2, "condition": 0.1, "counterexample": 0.0}


class BudgetSpent(Exception):
    """Raised by :meth:`Budget.check` once the deadline has passed (caught by the search)."""


@dataclass
class Budget:
    """``seconds`` of this process's CPU time from now (None: no limit), optionally also a wall-clock
    ``wall_deadline`` (``time.monotonic()``, the audit's ``--max-minutes``), and the record of what
    the budget cut.  CPU time, not wall time, measures a search: the searches are single-threaded
    SymPy, so a machine busy with other jobs does not make them stop earlier (or report differently)
    than an idle one."""

    seconds: float | None
    wall_deadline: float | None = None
    start: float = field(default_factory=time.process_time)
    cut: list[str] = field(default_factory=list)

    def left(self) -> float | None:
        """Seconds left (None: unlimited; never negative)."""
        out = None
        if self.seconds is not None:
            out = max(0.0, self.start + self.seconds - time.process_time())
        if self.wall_deadline is not None:
            wall = max(0.0, self.wall_deadline - time.monotonic())
            out = wall if out is None else min(out, wall)
        return out

    def spent(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0

    def check(self) -> None:
        if self.spent():
            raise BudgetSpent()

    def part(self, share: float, reserve: float = 0.0) -> Budget:
        """A sub-budget: at most ``share`` of the whole budget and what is left of it once a
        ``reserve`` share is kept for later steps; the same wall deadline; its cuts are recorded
        here too."""
        if self.seconds is None:
            return Budget(None, self.wall_deadline, cut=self.cut)
        left = max(0.0, self.start + self.seconds - time.process_time())
        return Budget(
            max(0.0, min(share * self.seconds, left - reserve * self.seconds)), self.wall_deadline, cut=self.cut
        )

    def record(self, what: str) -> None:
        self.cut.append(what)

    def limit_text(self) -> str:
        """What stopped a search: 'within N s (CPU)', or the audit's deadline."""
        if self.wall_deadline is not None and time.monotonic() >= self.wall_deadline:
            return "before the audit's --max-minutes deadline"
        return f"within {self.seconds:.3g} s (CPU)"


def unlimited() -> Budget:
    return Budget(None)


__all__ = ["Budget", "BudgetSpent", "CLAIM_SECONDS", "RESERVE", "SEARCH_SHARE", "SYMBOLIC_SECONDS", "unlimited"]
