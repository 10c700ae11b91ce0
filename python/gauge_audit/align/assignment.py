"""The linear assignment problem: a permutation minimising the summed cost of an n × n matrix.

scipy is not a dependency, so this is the shortest-augmenting-path form of the Hungarian
method (Kuhn–Munkres with the potentials of Jonker & Volgenant), one row added at a time, the
inner relaxation over all columns done by numpy: O(n³) arithmetic, O(n²) Python steps at worst.
It runs under a time budget: when the budget is spent, the rows not yet assigned are completed
greedily (cheapest free column first) and the result says so — exact or not, never silently.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Assignment:
    """perm[j] = the row assigned to column j (rows: this model's items, columns: the
    reference's), the total cost, and whether it is optimal (False: the budget ran out after
    ``exact_rows`` rows and the rest were completed greedily)."""

    perm: torch.Tensor
    cost: float
    exact: bool
    exact_rows: int


def assign(cost: torch.Tensor, deadline: float | None = None) -> Assignment:
    """Minimise Σ_j cost[perm[j], j] over permutations (``deadline``: a time.monotonic() value)."""
    c = cost.detach().to("cpu", torch.float64).numpy()
    n = c.shape[0]
    if c.shape != (n, n):
        raise ValueError(f"assignment needs a square cost matrix, got {c.shape}")
    if n == 0:
        return Assignment(torch.zeros(0, dtype=torch.long), 0.0, True, 0)
    c = c - c.min()  # shifts every assignment's cost equally; keeps the potentials small
    inf = np.inf
    # 1-based arrays as in the textbook form: column 0 is the virtual start of each search
    u = np.zeros(n + 1)
    v = np.zeros(n + 1)
    row_of = np.zeros(n + 1, dtype=np.int64)  # row_of[j]: the row assigned to column j (0: none)
    way = np.zeros(n + 1, dtype=np.int64)
    done = 0
    for i in range(1, n + 1):
        if deadline is not None and time.monotonic() > deadline:
            break
        row_of[0] = i
        j0 = 0
        minv = np.full(n + 1, inf)
        used = np.zeros(n + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = row_of[j0]
            free = ~used
            free[0] = False
            cur = c[i0 - 1] - u[i0] - v[1:]
            better = free[1:] & (cur < minv[1:])
            minv[1:][better] = cur[better]
            way[1:][better] = j0
            cand = np.where(free[1:], minv[1:], inf)
            j1 = int(np.argmin(cand)) + 1
            delta = cand[j1 - 1]
            u[row_of[used]] += delta
            v[used] -= delta
            minv[1:][free[1:]] -= delta
            j0 = j1
            if row_of[j0] == 0:
                break
        while j0:  # augment along the path
            j1 = way[j0]
            row_of[j0] = row_of[j1]
            j0 = j1
        done = i
    exact = done == n
    if not exact:
        _complete_greedily(c, row_of, done)
    perm = torch.as_tensor(row_of[1:] - 1, dtype=torch.long)
    total = float(cost.detach().to("cpu", torch.float64)[perm, torch.arange(n)].sum())
    return Assignment(perm, total, exact, done)


def _complete_greedily(c: np.ndarray, row_of: np.ndarray, done: int) -> None:
    """Rows done+1 … n (1-based) take the cheapest free column, one after the other; the
    partial assignment of rows 1 … done is kept (it is optimal for those rows)."""
    n = c.shape[0]
    free = row_of[1:] == 0
    for i in range(done + 1, n + 1):
        j = int(np.argmin(np.where(free, c[i - 1], np.inf)))
        row_of[j + 1] = i
        free[j] = False
