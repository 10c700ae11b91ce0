"""The experiments' evidence kinds can fail: a false group order, a wrong Hessian law, a loss that
does change, a head spoiled by a small amount — each rejected by a wide margin."""

from __future__ import annotations

import math

import pytest
import torch

from gauge_audit.experiments import alignment, discrete, moe_losses, sharpness
from gauge_audit.experiments.registry import CORRECTED, FAILS, HOLDS
from gauge_audit.runtime import reproducible


@pytest.fixture(autouse=True)
def _one_thread():
    with reproducible():
        yield


def test_gqa_discrete_group_false_order_rejected():
    rows, skipped = discrete.enumerate_configs([(4, 2), (6, 3)], seed=0)
    assert not skipped
    assert [r["preserving"] for r in rows] == [discrete.wreath_order(4, 2), discrete.wreath_order(6, 3)] == [8, 48]
    claimed = lambda r: math.factorial(r["n_q"]) * math.factorial(r["n_kv"])  # noqa: E731  the abstract's h!·g!
    f = discrete.judge_order(rows, skipped, claimed, "S_h × S_g")
    assert f.outcome == FAILS and "48 preserve" not in f.counterexample
    assert min(claimed(r) / r["preserving"] for r in rows) >= 6  # wrong by a factor ≥ 6
    off_by_one = discrete.judge_order(rows, skipped, lambda r: discrete.wreath_order(r["n_q"], r["n_kv"]) + 1, "x")
    assert off_by_one.outcome == FAILS
    assert (
        discrete.judge_order(rows, skipped, lambda r: discrete.wreath_order(r["n_q"], r["n_kv"]), "x").outcome == HOLDS
    )
    # the classification is far from its threshold on both sides
    assert all(r["max_ratio_preserving"] < 0.5 and r["min_ratio_other"] > 1e10 for r in rows)


def test_head_perm_order_tied_heads_counted_and_slight_spoiling_resolved():
    def tie(p, delta=0.0):
        g = torch.Generator().manual_seed(5)
        for k in ("W_Q", "W_K", "W_V", "W_O"):
            t = p[f"blocks.0.attn.{k}"]
            t[1] = t[0] + delta * torch.randn(t[0].shape, generator=g, dtype=t.dtype)

    assert discrete.enumerate_preserving(2, 2, edit=tie)["preserving"] == 4  # identical heads: 2!² pairs
    spoiled = discrete.enumerate_preserving(2, 2, edit=lambda p: tie(p, 1e-6))
    assert spoiled["preserving"] == 2 and spoiled["min_ratio_other"] > 1e3  # 10⁻⁶ apart: resolved


def test_wiki_gqa_wreath_symbol_reversed():
    f = discrete.wiki_gqa_wreath(0, False)
    assert f.outcome == CORRECTED and "S_g ≀ S_{n_kv}" in f.corrected_rule
    assert f.details["symbol_mismatches"] == ["6:3", "6:2"] and f.details["matches_group_structure"]


def test_wiki_gqa_chain_mqa_not_inside_gqa():
    f = discrete.wiki_gqa_chain(0, False)
    assert f.outcome == CORRECTED
    assert all(r["gqa_in_mha"] and not r["mqa_in_gqa"] for r in f.details["rows"])


def test_wiki_load_balance_breaks_losses_invariant_and_a_changed_router_detected():
    m = moe_losses.measure(0)
    assert all(not r["switch_changed"] and not r["gshard_changed"] for r in m["rows"])
    offset = next(r for r in m["rows"] if r["action"] == "router-offset")
    assert offset["output"] == HOLDS and offset["z_rel_change"] > 1e6 * offset["z_bound"]
    # a router column moved by one part in 10³ (not a symmetry): the loss moves ≥ 10× past the detector
    model = moe_losses.build(moe_losses.MODEL, seed=0, device="cpu")
    inputs = model.sample_inputs(0, batch=2, n=8)
    _, logits = moe_losses._run(model, model.params, inputs)
    spoiled = [lg.clone() for lg in logits]
    spoiled[0][..., 0] *= 1 + 1e-3
    a, b = moe_losses.losses(logits, 2), moe_losses.losses(spoiled, 2)
    assert abs(b["switch"] - a["switch"]) / a["switch"] > 10 * 1e3 * max(r["switch_bound"] for r in m["rows"])
    assert moe_losses.wiki_load_balance_breaks(0, False).outcome == FAILS


def test_wiki_routing_no_new_symmetry_router_offset_and_expert_perm():
    f = moe_losses.wiki_routing_no_new_symmetry(0, False)
    assert f.outcome == FAILS and "router-offset" in f.summary and "expert-perm" in f.summary


def test_wiki_sharpness_gauge_dependent_law_holds_and_wrong_law_rejected():
    m = sharpness.measure(0)
    assert m["base"]["loss"] == 0 and m["base"]["inertia"][1] == 16  # 16 = h·(d_k² + d_v²) flat directions
    for r in m["rows"]:
        assert r["law_residual"] <= r["law_tolerance"]
        if r["kappa_element"] > 1:
            assert r["wrong_law_residual"] > 1e6 * r["law_tolerance"]
    assert m["rows"][-1]["spectral_ratio"] > 10
    assert sharpness.wiki_sharpness_gauge_dependent(0, False).outcome == HOLDS


def test_wiki_invariant_sharpness_same_on_the_orbit():
    m = sharpness.measure(0)
    s0, s1 = m["invariant_from_theta"], m["invariant_from_g_theta"]
    assert abs(s0 - s1) / s0 < 1e-3 < abs(math.log(m["rows"][-1]["spectral_ratio"]))
    assert s0 < m["base"]["spectral"]
    assert sharpness.wiki_invariant_sharpness(0, False).outcome == HOLDS


def test_wiki_align_models_sampling_far_from_closed_form():
    f = alignment.wiki_align_models(0, False)
    assert f.outcome == FAILS and f.details["syntax_error"]
    assert f.details["closed_form_at_most"] <= f.details["tolerance"] < 1e-6 * f.details["sampled"]
