"""The survival cases shared by the per-family gauge-fixing tests (tests/test_gauge_fix_families.py,
tests/test_gauge_fix_mla.py): a transformed copy stored in a lower precision is EQUIVALENT at its
rounding level, an independently drawn model is DIFFERENT by a wide margin."""

from __future__ import annotations

import torch

from gauge_audit.actions import composite
from gauge_audit.gauge_fix import DIFFERENT, EQUIVALENT, compare
from gauge_audit.nullity.measure import EPS64
from gauge_audit.numeric import HOLDS, check
from gauge_audit.runtime import generator

#: the unit roundoff of each storage dtype
UNIT = {torch.float64: EPS64 / 2, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}


def transformed(m, seed: int, kappa: float = 4.0):
    """g·θ for a random g (condition number ``kappa``) of every action that applies, and g."""
    el, params = composite.sample_applied(m.cfg, m.params, generator(seed), kappa)  # = composite's apply(el)
    return params, el


def assert_transformed_copy_survives_storage(name: str, m, dtype: torch.dtype) -> None:
    """B = g·A stored in ``dtype``: EQUIVALENT, the invariant distance within the derived tolerance
    and at the storage rounding level, and the element found maps A to B (its check HOLDS)."""
    b, el = transformed(m, seed=11)
    r = compare(m.cfg, m.params, m.cfg, {k: v.to(dtype) for k, v in b.items()})
    u = UNIT[dtype]
    print(
        f"{name} {dtype}: raw {r.raw_distance:.3f}, invariant {r.invariant_distance / u:.3g} u, "
        f"tolerance {r.tolerance / u:.3g} u; element κ {r.kappa:.3g}, ‖g·A − B‖/‖B‖ = {r.element_residual:.2e}"
    )
    assert r.verdict == EQUIVALENT and r.raw_distance >= 0.3
    assert r.invariant_distance <= r.tolerance
    assert r.invariant_distance <= el.kappa * 64 * u
    # B's rounding (u) and applying the element's steps (products of length ≤ n each), amplified by κ
    n = max(m.cfg.d_model, m.cfg.d_ff)
    assert r.element_residual <= r.kappa * (u + n * EPS64)
    assert check(m, "composite", element=r.element).verdict == HOLDS


def assert_independent_model_is_different(name: str, a, b) -> None:
    r = compare(a.cfg, a.params, b.cfg, b.params, with_element=False)
    print(f"{name}: invariant {r.invariant_distance:.3g} = {r.invariant_distance / r.tolerance:.3g}× the tolerance")
    assert r.verdict == DIFFERENT and r.invariant_distance >= 1e6 * r.tolerance
