"""Thread policy: the audit's report.json is byte-identical whatever OMP_NUM_THREADS says (torch
splits long reductions and LAPACK factorisations across threads, which changes their last bits),
and the thread count is restored after each phase that chose its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from gauge_audit import runtime

# Claims whose reported numbers moved with the thread count before the audit chose its own
# (OMP_NUM_THREADS=1 against 2): every nullity gap ratio (the smallest measured singular value is
# rounding noise, and LAPACK splits its QR / SVD across threads), and vo-gl's sampled element
# (κ = 10.000000000000021 against …23, from its factorisation) with its residual on the real
# weights (89.1 ε against 30.6 ε); and two whose evidence is drawn from the seed (random elements,
# inputs and counterexample data).
CLAIMS = ("vo-gl", "maximality", "ln-affine-rotation", "relu-forces-identity")


def _entries(report_json: bytes) -> dict[str, str]:
    """Each claim's entry of a report.json, serialised as the report writes numbers (repr, which
    round-trips every float exactly): equal strings are equal bits."""
    return {c["id"]: json.dumps(c, sort_keys=True, ensure_ascii=False) for c in json.loads(report_json)["claims"]}


def test_report_json_byte_identical_across_thread_counts(catalog_report, tmp_path):
    """A fresh process at another thread count audits CLAIMS at the same seed (0): each claim's
    entry of its report.json is the one of the session's catalog audit (this process's thread
    count, two worker processes, every other claim audited beside it in one shared context)."""
    threads = 2 if torch.get_num_threads() == 1 else 1
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(Path(runtime.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "r"
    argv = ["audit", "--only", ",".join(CLAIMS), "--seed", "0", "--out", str(out), "--quiet"]
    p = subprocess.run(
        [sys.executable, "-c", "import sys; from gauge_audit.cli import main; sys.exit(main())", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    got = (out / "report.json").read_bytes()
    assert b'"gap_ratio"' in got and b'"residual_eps"' in got  # the numbers that used to move
    fresh, catalog = _entries(got), _entries((catalog_report[1] / "report.json").read_bytes())
    assert list(fresh) == list(CLAIMS)
    for claim in CLAIMS:
        assert fresh[claim] == catalog[claim], claim
    timings = (out / "timings.json").read_text()
    assert "total" in timings and b"seconds" not in got  # wall times live outside report.json


def test_thread_choices_restore_the_count():
    before = torch.get_num_threads()
    with runtime.one_thread():
        assert torch.get_num_threads() == 1
        with runtime.model_threads(runtime.LARGE_MODEL_PARAMS + 1):
            assert torch.get_num_threads() == runtime.DEFAULT_THREADS
        assert torch.get_num_threads() == 1
        with runtime.model_threads(135_000_000):  # SmolLM2-sized: small operations
            assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_reproducible_pins_one_thread_for_nested_choices():
    with runtime.reproducible():
        with runtime.dense_threads(10 * runtime.DENSE_KERNEL_MIN):
            assert torch.get_num_threads() == 1
        with runtime.model_threads(10 * runtime.LARGE_MODEL_PARAMS):
            assert torch.get_num_threads() == 1
    with runtime.one_thread():
        with runtime.dense_threads(runtime.DENSE_KERNEL_MIN):
            assert torch.get_num_threads() == runtime.DEFAULT_THREADS
        with runtime.dense_threads(runtime.DENSE_KERNEL_MIN - 1):
            assert torch.get_num_threads() == 1


def test_lu_on_a_stack_of_matrices_is_correct_on_two_threads():
    """torch's LU on a stack of matrices from ~150 rows on, on more than one thread, raises (MKL:
    "Parameter 6 was incorrect on entry to DLASWP") or returns wrong numbers without a word; the
    project's LU calls (runtime.stacked_*) run a stack on one thread and agree with the matrices
    one by one to n·κ·ε.  The built-in vo-gl action on 256-wide heads (Gemma 3 270M's, here on a
    random model of its shapes) stays a symmetry on two threads."""
    from gauge_audit.models import build_config, config_of
    from gauge_audit.numeric import check

    g = torch.Generator().manual_seed(0)
    n = 256
    a = torch.randn(4, n, n, dtype=torch.float64, generator=g) + n**0.5 * torch.eye(n, dtype=torch.float64)
    b = torch.randn(4, n, 8, dtype=torch.float64, generator=g)
    kappa = float(torch.linalg.cond(a).max())
    tol = n * kappa * runtime.eps(torch.float64)
    with runtime.threads(2):
        assert torch.get_num_threads() == 2
        x, inv, det = runtime.stacked_solve(a, b), runtime.stacked_inv(a), runtime.stacked_det(a)
        lu, piv = runtime.stacked_lu_factor(a)
    for i in range(4):
        one = torch.linalg.solve(a[i], b[i])
        assert float((x[i] - one).abs().max() / one.abs().max()) <= tol
        assert float((a[i] @ inv[i] - torch.eye(n, dtype=torch.float64)).abs().max()) <= tol
        assert abs(float(det[i] / torch.linalg.det(a[i])) - 1) <= tol
        assert int(piv[i].min()) >= 1 and float((torch.linalg.lu_solve(lu[i], piv[i], b[i]) - one).abs().max()) <= tol
    cfg = config_of("gpt2-tiny").with_(n_heads=2, n_kv_heads=2, d_head=n, n_layers=1)
    with runtime.threads(2):
        r = check(build_config(cfg, seed=0, device="cpu"), "vo-gl", seed=0)
    assert r.holds, (r.verdict, r.residual_eps, r.tolerance_statistical_eps)
