"""ffn-perm against a reference: :func:`match_directions` (float32 products, the contenders
recomputed in float64) chooses what :func:`match` chooses on the whole float64 similarity matrix —
the same assignment, the same margin to rounding — on generic units, on near-equal and equal
directions, dead units, a choice that is not one-to-one, and with float32 products set to a lower
precision; and every float32 entry lies within the bound the contenders are chosen with."""

from __future__ import annotations

import pytest
import torch

from gauge_audit.gauge_fix import ffn
from gauge_audit.gauge_fix.base import match
from gauge_audit.gauge_fix.ffn import _unit_columns, match_directions, similarity_screen

U32 = 2.0**-24
U64 = 2.0**-53


def _whole(pairs):
    sim = sum((_unit_columns(x).T @ _unit_columns(y)).abs() for x, y in pairs)
    return match(-sim)


def _pairs(n: int, f: int, seed: int, noise: float, k: int = 3):
    """k (x, y) pairs: y a reference's unit directions, x the same units permuted, rescaled per unit
    and moved by ``noise`` (relative)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(f, generator=g)
    scale = torch.rand(f, generator=g, dtype=torch.float64) * 3 + 0.1
    out = []
    for _ in range(k):
        y = torch.randn(n, f, generator=g, dtype=torch.float64)
        x = y[:, perm] * scale + noise * torch.randn(n, f, generator=g, dtype=torch.float64)
        out.append((x, y))
    return out


def _same(pairs):
    """The same assignment; the same margin within what the two summation orders of each entry
    allow: every entry is a sum of k |dot products| of length-n unit columns, each within γ_n ≈ n·u
    of exact (u = 2⁻⁵³) in either order, so entries differ by ≤ 2kγ_n and the margin
    (v₁ − v₂)/scale by ≤ 6kγ_n/scale."""
    got, want = match_directions(pairs), _whole(pairs)
    assert torch.equal(got[0], want[0])
    k, n = len(pairs), pairs[0][0].shape[0]
    scale = float(sum((_unit_columns(x).T @ _unit_columns(y)).abs() for x, y in pairs).max())
    tol = 6 * k * 1.01 * n * U64 / max(scale, 1e-300)
    assert abs(got[1] - want[1]) <= tol, (got[1], want[1], tol)
    return got


@pytest.mark.parametrize("screen_rows", [2048, 37])
@pytest.mark.parametrize("noise", [0.0, 1e-3, 0.3, 3.0])
def test_generic_units_same_assignment_and_margin(noise, screen_rows, monkeypatch):
    """Also with the reference units screened in blocks of 37 (a ragged last block)."""
    monkeypatch.setattr(ffn, "SCREEN_ROWS", screen_rows)
    pairs = _pairs(577, 300, seed=1, noise=noise)
    perm, margin = _same(pairs)
    if noise <= 0.3:
        assert margin > 0.01  # the units are found again, clearly
        assert torch.equal(torch.sort(perm).values, torch.arange(300))


def test_equal_and_near_equal_directions():
    """Two reference units with the same directions (a tie: margin 0, the first row chosen, as
    argmin does), and two whose directions differ by far less than the float32 bound."""
    pairs = _pairs(200, 64, seed=2, noise=0.0)
    for x, y in pairs:
        y[:, 7] = y[:, 3]
        x[:, 11] = x[:, 5] * 2
        x[:, 12] = x[:, 5] * (1 + 1e-9)
    _same(pairs)


def test_dead_units_and_a_choice_that_is_not_one_to_one():
    pairs = _pairs(100, 40, seed=3, noise=0.0)
    for x, y in pairs:
        x[:, :6] = 0.0  # dead units: similarity 0 to everything
        y[:, :6] = 0.0
    _same(pairs)
    collide = _pairs(50, 30, seed=4, noise=0.0)
    for x, _ in collide:
        x[:, 1] = x[:, 0]  # two rows best for the same reference units: match's greedy path
    assert match_directions(collide)[1] == _whole(collide)[1] == 0.0
    _same(collide)


def test_lower_precision_float32_products_take_the_whole_float64_matrix():
    pairs = _pairs(300, 50, seed=5, noise=0.1)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        got, want = match_directions(pairs), _whole(pairs)
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_float32_entries_within_the_bound():
    """The screen's float32 similarities lie within its bound E = Σ (γ_n + 7u) of the float64 ones,
    entry by entry (products in a coarser precision — bfloat16 inputs: errors near 10⁻² — would fail
    here); columns far from norm 1, and dead ones, included."""
    pairs = _pairs(1000, 256, seed=6, noise=1.0)
    for x, y in pairs:
        x[:, :4] *= 1e12
        x[:, 4:8] *= 1e-12
        y[:, 8:10] = 0.0
    sim32, bound = similarity_screen(pairs)
    n = pairs[0][0].shape[0]
    assert bound >= len(pairs) * (n * U32 / (1 - n * U32) + 7 * U32)
    sim64 = sum((_unit_columns(x).T @ _unit_columns(y)).abs() for x, y in pairs)
    err = float((sim32.T.to(torch.float64) - sim64).abs().max())
    print(f"largest float32 error {err:.2e}, bound {bound:.2e}")
    assert err <= bound


def test_the_screen_refuses_columns_outside_float32s_range():
    pairs = _pairs(50, 20, seed=8, noise=0.0)
    pairs[0][0][:, 3] *= 1e-40
    assert similarity_screen(pairs) is None
    _same(pairs)  # the whole float64 matrix


def test_same_result_on_one_and_two_threads():
    """The float32 products' last bits move with the thread count; the contenders they select
    always include the deciding entries, which are computed the same way: the same result."""
    from gauge_audit.runtime import threads

    pairs = _pairs(1024, 1024, seed=7, noise=0.05, k=2)  # wide enough for BLAS to split the product
    with threads(1):
        one = match_directions(pairs)
    with threads(2):
        two = match_directions(pairs)
    assert torch.equal(one[0], two[0]) and one[1] == two[1]
