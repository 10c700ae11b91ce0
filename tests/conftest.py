"""Shared fixtures: models are built once per session (building is deterministic)."""

from __future__ import annotations

import functools

import pytest

from gauge_audit.models import build


@functools.lru_cache(maxsize=None)
def _model(name: str, seed: int = 0):
    return build(name, seed=seed, device="cpu")


@pytest.fixture(scope="session")
def model():
    """``model(name, seed=0)`` -> a cached float64 CPU model (treat as read-only)."""
    return _model
