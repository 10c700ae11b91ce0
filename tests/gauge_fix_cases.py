"""The survival cases shared by the per-family gauge-fixing tests (tests/test_gauge_fix_families.py,
tests/test_gauge_fix_mla.py): a transformed copy stored in a lower precision is EQUIVALENT at its
rounding level, an independently drawn model is DIFFERENT by a wide margin."""

from __future__ import annotations

import json

import torch

from gauge_audit.actions import ACTIONS, composite
from gauge_audit.gauge_fix import DIFFERENT, EQUIVALENT, canonicalize, compare
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


def assert_b_by_runs_is_b_whole(m, stored, monkeypatch, runs: int) -> None:
    """compare of ``stored`` against ``m`` with B canonicalised in ``runs`` runs of blocks gives the
    report of B as one run of every block, number for number — verdict, distances, tolerances,
    decisions and notes — and the same element mapping A to B; and one run of every block is the
    public canonical form of B against A's."""
    from gauge_audit.gauge_fix import streamed

    merged, b_runs = [], streamed.b_runs

    def spy(cfg, params):
        out = b_runs(cfg, params)
        merged.append(len(out))
        return out

    monkeypatch.setattr(streamed, "b_runs", spy)
    fast = compare(m.cfg, m.params, m.cfg, stored)
    assert merged == [runs]  # and merged: no second pass as one run
    monkeypatch.setattr(streamed, "b_runs", lambda cfg, params: [(0, cfg.n_layers)])
    whole = compare(m.cfg, m.params, m.cfg, stored)
    assert json.dumps(fast.to_json(), sort_keys=True) == json.dumps(whole.to_json(), sort_keys=True)
    assert fast.canonical_b is not None and whole.canonical_b is not None and whole.canonical_a is not None
    plain = canonicalize(m.cfg, stored, reference=whole.canonical_a.params)
    for rf, rw in zip(whole.canonical_b.records, plain.records, strict=True):
        assert (rf.family, rf.reads, rf.writes, rf.notes) == (rw.family, rw.reads, rw.writes, rw.notes)
        assert rf.element.kappa == rw.element.kappa and rf.element.parts.keys() == rw.element.parts.keys()
        assert all(torch.equal(rf.element.parts[k], rw.element.parts[k]) for k in rf.element.parts)
    # the runs' records merged (a step taken block by block is one record of every block): g_B
    # applied to B is B's canonical form, to the last bit
    stored64 = {k: v.to(torch.float64) for k, v in stored.items()}
    mapped = ACTIONS["composite"].apply(m.cfg, stored64, fast.canonical_b.element())
    assert all(torch.equal(mapped[k], plain.params[k]) for k in plain.params)
    assert fast.element is not None and whole.element is not None
    assert all(torch.equal(fast.element.parts[k], whole.element.parts[k]) for k in whole.element.parts)
