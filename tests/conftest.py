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


@pytest.fixture(scope="session")
def catalog_report(tmp_path_factory):
    """The default audit of the built-in catalog (seed 0), run once per session,
    with its report files written to a temporary directory."""
    from gauge_audit.audit.checkers import Context
    from gauge_audit.audit.run import audit
    from gauge_audit.claims import load_catalog
    from gauge_audit.report import write

    catalog = load_catalog()
    report = audit(list(catalog.values()), Context(seed=0), progress=None)
    out = tmp_path_factory.mktemp("report")
    write(report, out)
    return report, out


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say which shuffled order ran (pytest-randomly's header line is hidden by -q), so any
    order-dependent failure can be repeated with --randomly-seed=N."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None and not isinstance(seed, str):
        terminalreporter.write_line(f"test order shuffled by pytest-randomly: repeat it with --randomly-seed={seed}")
