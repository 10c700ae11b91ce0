"""The nullity audit end to end: measure, explain, compare with the papers' counts.

:func:`analyze` runs one configuration (dense or matrix-free) and returns a
:class:`NullityReport`; :func:`maximality_verdicts` runs the audit's standard
configurations and returns one structured verdict per family for the ``audit``
command (claim ``maximality``: is G_max the whole continuous symmetry group?).
"""

from __future__ import annotations

import time

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..runtime import dense_threads
from . import cost
from . import explain as ex
from .families import Family, theory
from .matrixfree import analyze_matrix_free
from .measure import (
    Genericity,
    Problem,
    Spectrum,
    dense_jacobian,
    generic_inputs,
    jvp_rows,
    make_problem,
    null_basis,
    numerical_rank,
    progress,
    singular_values,
)
from .report import MaximalityVerdict, NullityReport, describe, gmax_dimension, make_report, paper_counts, verdict

DENSE_LIMIT = 6000  # above this P the dense path is refused (memory and SVD time)


# ----------------------------------------------------------------------------- analyze
def analyze(
    cfg: Config,
    seed: int = 0,
    method: str = "dense",
    factor: float = 3.0,
    quiet: bool = True,
    mf_options: dict | None = None,
    max_minutes: float | None = cost.DEFAULT_MAX_MINUTES,
) -> NullityReport:
    """Measure the nullity of J at a generic point of ``cfg`` and explain it.

    Before any work, the cost model (:mod:`.cost`) estimates memory and time; a measurement
    that would exceed the free memory or ``max_minutes`` (None: no time limit) is refused
    with the estimate.

    Threads (runtime's thread policy): one below P = 2048 parameters, where every operation is
    small; every thread from there on, where the Jacobian blocks, the Gram and the factorisations
    are large dense kernels."""
    with dense_threads(cost.parameter_count(cfg)):
        return _analyze(cfg, seed, method, factor, quiet, mf_options, max_minutes)


def _analyze(
    cfg: Config, seed: int, method: str, factor: float, quiet: bool, mf_options: dict | None, max_minutes: float | None
) -> NullityReport:
    if method not in ("dense", "matrix-free"):
        raise GaugeAuditError(f"unknown method {method!r} (choose dense or matrix-free)")
    t0 = time.time()
    if method == "matrix-free":
        sketch = (mf_options or {}).get("sketch", cost.MATRIX_FREE_SKETCH)
        cost.require_feasible(cost.estimate(cfg, method, sketch=sketch), max_minutes)
        return analyze_matrix_free(cfg, seed, quiet, t0, **(mf_options or {}))
    P = cost.parameter_count(cfg)
    if P > DENSE_LIMIT:
        mf = cost.estimate(cfg, "matrix-free")
        raise GaugeAuditError(
            f"P = {P:,} parameters is above the dense limit {DENSE_LIMIT:,}; "
            f"--method matrix-free would need ≈ {cost.size_text(mf.bytes)} and "
            f"≈ {cost.duration_text(mf.seconds)} ({mf.detail})"
        )
    history: list[tuple[int, int]] = []
    while True:
        cost.require_feasible(cost.estimate(cfg, method, factor=factor), max_minutes)
        problem = make_problem(cfg, seed, factor=factor)
        progress(
            f"{cfg.family}: P = {problem.P} parameters, {problem.rows} output rows "
            f"({problem.batch} sequences), method {method}",
            quiet,
        )
        gen, fams = theory(problem, quiet)
        timings = {"setup": time.time() - t0}
        J = dense_jacobian(problem, quiet=quiet)
        timings["jacobian"] = time.time() - t0 - timings["setup"]
        report = _analyze_dense(problem, gen, fams, timings, quiet, J)
        history.append((problem.rows, report.measured_nullity))
        # converged when P rows more (fresh inputs, the same parameters) leave the nullity as it is
        more = Problem(
            problem.model,
            problem.layout,
            problem.theta,
            generic_inputs(cfg, problem.P, seed + 1 + 7919 * len(history), factor=1.0),
            seed,
        )
        # J's triangle R (P × P; JᵀJ = RᵀR) stacked on the new rows: the spectrum of both blocks
        R = torch.linalg.qr(J, mode="r").R if J.shape[0] > J.shape[1] else J
        nullity = numerical_rank(singular_values(torch.cat([R, dense_jacobian(more, quiet=True)]), quiet=True)).nullity
        history.append((problem.rows + more.rows, nullity))
        del R
        converged = nullity == report.measured_nullity
        if converged or factor * 2 > MAX_ROWS_FACTOR:
            break
        progress(
            f"nullity {report.measured_nullity} at {problem.rows} rows, {nullity} with {more.rows} more: doubling",
            quiet,
        )
        factor *= 2
    report.extra["rows_history"] = history
    report.extra["converged"] = converged
    return report


MAX_ROWS_FACTOR = 24.0  # rows ≤ 24·P: where adding rows stops, converged or not


def _analyze_dense(
    problem: Problem, gen: Genericity, fams: list[Family], timings: dict, quiet: bool, J: torch.Tensor | None = None
) -> NullityReport:
    if J is None:  # one measurement at the problem's rows (no convergence steps)
        t = time.time()
        J = dense_jacobian(problem, quiet=quiet)
        timings["jacobian"] = time.time() - t
    t = time.time()
    s = singular_values(J, quiet=quiet)
    spec = numerical_rank(s)
    timings["svd"] = time.time() - t
    t = time.time()
    j_fro = ex.frobenius(J)
    JV = [f.vectors @ J.T for f in fams]
    expl = ex.check_families(problem, fams, JV, j_fro, spec.threshold)
    timings["generators"] = time.time() - t
    report = make_report(
        problem,
        gen,
        fams,
        expl,
        spec.nullity,
        spec.gap_ratio,
        spec.second_gap,
        spec.threshold / float(s[0]),
        "dense",
        timings,
        j_fro,
        s,
    )
    if report.unexplained != 0 or not expl.all_within_tolerance:
        t = time.time()
        null = null_basis(J, spec.rank)
        u = ex.unexplained_directions(problem, null, expl.basis)
        report.unexplained_blocks = ex.summarize_blocks(u)
        report.unexplained_examples = u.blocks[:8]
        timings["unexplained"] = time.time() - t
    progress(f"measured nullity {spec.nullity}, explained {expl.explained}, gap {spec.gap_ratio:.3g}", quiet)
    return report


def standard_configs() -> list[Config]:
    """The audit's configurations, one or more per architecture family (small: dense, seconds each)."""
    from ..models import attn, bert, gpt2, llama, moe, qwen

    small = dict(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, d_ff=6, n_ctx=5, vocab=8)
    return [
        attn.config(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=5, attn_bias=False, out_bias=False),
        attn.config(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=5),
        attn.config(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, n_ctx=5, pos="rope", attn_bias=False, out_bias=False),
        gpt2.config(n_layers=1, **small),
        bert.config(n_layers=1, **small),
        llama.config(n_layers=1, **{**small, "n_heads": 2, "n_kv_heads": 1}),
        qwen.config(n_layers=1, **{**small, "n_heads": 2, "n_kv_heads": 1}),
        moe.config(n_layers=1, experts=3, top_k=2, **{**small, "n_heads": 2, "n_kv_heads": 1}),
    ]


def maximality_verdicts(
    configs: list[Config] | None = None, seed: int = 0, quiet: bool = True
) -> list[MaximalityVerdict]:
    """Per family: does G_max account for every measured flat direction?  (For the audit command.)"""
    return [verdict(analyze(c, seed=seed, quiet=quiet)) for c in (configs or standard_configs())]


__all__ = [
    "NullityReport",
    "MaximalityVerdict",
    "analyze",
    "paper_counts",
    "gmax_dimension",
    "verdict",
    "maximality_verdicts",
    "standard_configs",
    "describe",
    "Spectrum",
    "jvp_rows",
]
