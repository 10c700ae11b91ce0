"""Thread policy: the audit's report.json is byte-identical whatever OMP_NUM_THREADS says (torch
splits long reductions and LAPACK factorisations across threads, which changes their last bits),
and the thread count is restored after each phase that chose its own."""

from __future__ import annotations

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
# weights (89.1 ε against 30.6 ε).
CLAIMS = "vo-gl,maximality"


def _audit(out: Path, threads: int) -> bytes:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(Path(runtime.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gauge_audit.cli import main; sys.exit(main())",
            "audit",
            "--only",
            CLAIMS,
            "--out",
            str(out),
            "--quiet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return (out / "report.json").read_bytes()


def test_report_json_byte_identical_across_thread_counts(tmp_path):
    one, two = _audit(tmp_path / "t1", 1), _audit(tmp_path / "t2", 2)
    assert b'"gap_ratio"' in one and b'"residual_eps"' in one  # the numbers that used to move
    assert one == two
    timings = (tmp_path / "t1" / "timings.json").read_text()
    assert "total" in timings and b"seconds" not in one  # wall times live outside report.json


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
