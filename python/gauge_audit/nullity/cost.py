"""What a nullity measurement will cost, estimated before any work starts.

The estimate needs only the parameter count P (from the family's parameter shapes — no
model is built) and the cost model of each method:

* **dense** — J has m = factor·P rows (3·P by default) and is held whole (8·m·P bytes);
  its SVD (LAPACK gesdd, values only) costs ≈ 4·m·P² + 8·P³ flops at about half the
  matrix-product rate (the bidiagonalisation is half BLAS-2), and needs one more m × P
  workspace.
* **matrix-free** — the certificate works on n ≤ P coordinates (P minus the exact
  generators' count, which is not known before the theory is built; n = P is used, an
  upper bound) with a sketch of m ≈ 1.05·n rows: the Gram m·n² flops (syrk), its Cholesky
  n³/3, both at the matrix-product rate; memory the n × n Gram plus its factor
  (16·n² bytes) and the streamed row buffers.  The rows themselves (one reverse pass per
  sketch row, ≈ 6·P flops each at a tenth of the rate) are a small share at every size
  that fits.

The rate is the machine's: :func:`matmul_gflops` times a float64 matrix product once per
process (≈ 0.1 s), so the estimate is right on whatever machine runs it.  The free memory
is :func:`gauge_audit.runtime.available_memory` (``MemAvailable`` from ``/proc/meminfo``, or the OS's
count of available pages).

:func:`require_feasible` refuses, with one line giving the estimate, any measurement whose
memory exceeds the free memory or whose time exceeds the budget (``--max-minutes``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch

from ..errors import GaugeAuditError
from ..models import parameter_count
from ..models.config import Config
from ..runtime import available_memory, size_text

DEFAULT_MAX_MINUTES = 15.0  # the CLI's default budget (P ≈ 20 000 takes about a minute on 2 cores)
MATRIX_FREE_SKETCH = 1.05  # sketch rows per certificate coordinate (matrixfree.analyze_matrix_free's default)
FLUSH = 4096  # rows per Gram update (matrixfree.FLUSH)


@dataclass(frozen=True)
class Estimate:
    method: str
    params: int  # P
    coords: int  # n: the coordinates the expensive step works on (≤ P)
    rows: int  # m
    flops: float
    bytes: float
    seconds: float
    gflops: float  # the machine rate the seconds assume
    detail: str  # which terms dominate

    def describe(self) -> str:
        return (
            f"P = {self.params:,} parameters: {self.method} needs ≈ {size_text(self.bytes)} of memory and "
            f"≈ {duration_text(self.seconds)} at this machine's {self.gflops:.0f} GFLOP/s ({self.detail})"
        )


def duration_text(s: float) -> str:
    if s >= 3.15e7:
        return f"{s / 3.15e7:.3g} years"
    if s >= 86400:
        return f"{s / 86400:.3g} days"
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    return f"{s:.2g} s"


@functools.lru_cache(maxsize=1)
def matmul_gflops(n: int = 1024, repeats: int = 3) -> float:
    """The machine's float64 matrix-product rate (best of a few n × n products, GFLOP/s)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    b = torch.randn(n, n, generator=g, dtype=torch.float64)
    a @ b  # warm-up (thread pool, caches)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / max(best, 1e-9) / 1e9


def estimate(
    cfg: Config, method: str, factor: float = 3.0, sketch: float = MATRIX_FREE_SKETCH, gflops: float | None = None
) -> Estimate:
    """Memory and time of :func:`gauge_audit.nullity.analyze` on ``cfg`` by the cost model above."""
    P = parameter_count(cfg)
    rate = gflops if gflops is not None else matmul_gflops()
    moe = max(1.0, cfg.experts / cfg.top_k) if cfg.experts else 1.0
    if method == "dense":
        m = factor * moe * P
        flops = 4.0 * m * P * P + 8.0 * float(P) ** 3
        seconds = flops / (0.5 * rate * 1e9)
        memory = 2 * 8.0 * m * P
        detail = f"J {m:,.0f} × {P:,} and its SVD ≈ {flops:.2g} flops"
        return Estimate(method, P, P, int(m), flops, memory, seconds, rate, detail)
    n = float(P)
    m = sketch * moe * n
    gram, chol, rows = m * n * n, n**3 / 3.0, 6.0 * m * P
    flops = gram + chol + rows
    seconds = (gram + chol) / (rate * 1e9) + rows / (0.1 * rate * 1e9)
    memory = 16.0 * n * n + 8.0 * (n + 1) * (FLUSH + 64)
    detail = (
        f"Gram m·n² = {gram:.2g} and Cholesky n³/3 = {chol:.2g} flops, n ≤ {P:,} coordinates, m ≈ {m:,.0f} sketch rows"
    )
    return Estimate(method, P, int(n), int(m), flops, memory, seconds, rate, detail)


def require_feasible(est: Estimate, max_minutes: float | None = DEFAULT_MAX_MINUTES, free: float | None = None) -> None:
    """Raise (one line, with the estimate) if the measurement cannot fit in memory or time."""
    free = available_memory() if free is None else free
    why = []
    if est.bytes > free:
        why.append(f"more than the {size_text(free)} of free memory")
    if max_minutes is not None and est.seconds > 60.0 * max_minutes:
        why.append(f"longer than the --max-minutes budget of {max_minutes:g} min")
    if why:
        raise GaugeAuditError(
            f"{est.describe()} — {' and '.join(why)}; refusing before starting "
            "(choose a smaller configuration, or raise --max-minutes if only the time is short)"
        )
