"""runtime.Forked: work in a forked helper process comes back by value, its bad-input error as
the same one-line error, a bug with the helper's traceback, a killed helper as an error naming its
exit code — and without fork the same work runs in the caller."""

from __future__ import annotations

import os

import pytest
import torch

from gauge_audit.errors import GaugeAuditError
from gauge_audit.runtime import Forked


def _work(n: int) -> tuple[int, torch.Tensor]:
    return os.getpid(), torch.arange(n, dtype=torch.float64) ** 2


def _refuse(what: str) -> None:
    raise GaugeAuditError(f"bad {what}", "second line")


def _bug() -> None:
    raise ZeroDivisionError("helper bug")


def _die() -> None:
    os._exit(7)


def test_forked_result_by_value_from_another_process():
    pid, t = Forked(_work, 5).result()
    assert pid != os.getpid()
    assert torch.equal(t, torch.tensor([0.0, 1.0, 4.0, 9.0, 16.0], dtype=torch.float64))


def test_forked_without_fork_runs_in_the_caller():
    pid, t = Forked(_work, 3, fork=False).result()
    assert pid == os.getpid() and t.tolist() == [0.0, 1.0, 4.0]


def test_forked_errors():
    with pytest.raises(GaugeAuditError) as e:
        Forked(_refuse, "input").result()
    assert e.value.lines == ["bad input", "second line"]
    with pytest.raises(RuntimeError, match="ZeroDivisionError: helper bug"):
        Forked(_bug).result()
    with pytest.raises(GaugeAuditError, match="exit code 7"):
        Forked(_die).result()
