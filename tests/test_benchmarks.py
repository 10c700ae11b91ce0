"""The GPU benchmark (benchmarks/gpu_check.py) is run once by whoever is lent a CUDA machine, in one
call under a time budget: a broken script would waste that call.  Its --quick path runs every step
at tiny sizes on the CPU, through the same functions as the full run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gauge_audit.actions import ACTIONS
from gauge_audit.models import config_of

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def test_gpu_check_quick_runs_every_step_and_agrees_with_theory(capsys):
    gpu_check = _gpu_check()
    assert gpu_check.main(["--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("  ") and "[" in line]
    actions = [a.name for a in ACTIONS.values() if a.applies(config_of("llama-tiny-gqa")) is None]
    for dtype in gpu_check.DTYPES:
        for a in actions:
            assert any(f"check llama-tiny-gqa {a} [{dtype}, cpu]" in r for r in rows), (a, dtype)
    assert "skipped" not in out and "differs from theory" not in out
    nullity = next(r for r in rows if "nullity certificate" in r)
    assert "(unexplained 0)" in nullity
    assert next(r for r in rows if r.lstrip().startswith("canonicalize")).endswith("HOLDS")
    assert next(r for r in rows if r.lstrip().startswith("compare")).endswith("EQUIVALENT")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_gpu_check_asked_for_cuda_without_one_says_so(capsys):
    assert _gpu_check().main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
