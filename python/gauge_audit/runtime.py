"""Device, dtype and random-generator selection shared by every checker."""

from __future__ import annotations

import contextlib

import torch

from .errors import GaugeAuditError

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when a GPU is visible and the CPU otherwise."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise GaugeAuditError("--device cuda requested but no CUDA device is available")
        return torch.device("cuda")
    raise GaugeAuditError(f"unknown device {name!r} (choose auto, cpu or cuda)")


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise GaugeAuditError(f"unknown dtype {name!r} (choose {', '.join(DTYPES)})") from None


def generator(seed: int) -> torch.Generator:
    """A CPU generator: draws are made on the CPU in float64 and then moved, so the
    same seed gives the same numbers on every device."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g


def eps(dtype: torch.dtype) -> float:
    """Unit roundoff convention used throughout: machine epsilon ``torch.finfo(dtype).eps``."""
    return float(torch.finfo(dtype).eps)


@contextlib.contextmanager
def one_thread():
    """Run torch on one intra-op thread inside the block (the previous setting is restored).
    For work made of many small operations (small models, one factorisation per head): on an
    oversubscribed CPU the hand-offs and spin-waits between threads dominate, e.g. MiniLM's
    canonicalisation took 43 s with two threads at a load of 6 and 1.5 s on one
    (``benchmarks/bench_gauge_fix.py`` prints the ratio at the current load)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
