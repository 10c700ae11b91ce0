"""The matrix exponential the group actions use (``runtime.matrix_exp``), against mpmath's at 40
digits: every 1-norm from 10⁻³ to 10 (torch's own single-matrix path loses up to 9·10⁴ ε between
about 0.01 and 0.05 in float64), diagonal, skew and dense matrices, and the two sides of a GL
action cancelling: exp(Cᵀ)ᵀ·exp(−C) = I."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from gauge_audit.runtime import eps, generator, matrix_exp

E = eps(torch.float64)


def _bound(a: torch.Tensor) -> float:
    """Relative to max |exp(a)|: n·ε per Horner step and per squaring, with room (×4) for the
    growth of ‖exp(a/2^k)‖ over max |exp(a/2^k)|."""
    n = a.shape[-1]
    norm = float(a.abs().sum(0).max())
    s = math.ceil(math.log2(norm / 0.5)) if norm > 0.5 else 0
    return 4 * n * (16 + s) * E


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("kind", ["diagonal", "skew", "dense"])
def test_matrix_exp_agrees_with_mpmath_at_every_norm(n, kind):
    mpmath.mp.dps = 40
    g = generator(n)
    for norm in (1e-3, 0.01, 0.02, 0.03, 0.05, 0.1, 0.5, 2.0, 10.0):
        a = torch.randn(n, n, generator=g, dtype=torch.float64)
        a = torch.diag(torch.diag(a)) if kind == "diagonal" else (a - a.T if kind == "skew" else a)
        a = norm * a / a.abs().sum(0).max()
        ref = torch.tensor(mpmath.expm(mpmath.matrix(a.tolist())).tolist(), dtype=torch.float64)
        err = float((matrix_exp(a) - ref).abs().max() / ref.abs().max())
        assert err <= _bound(a), (norm, err / E, _bound(a) / E)
        one = matrix_exp(a.T).T @ matrix_exp(-a)
        assert float((one - torch.eye(n, dtype=torch.float64)).abs().max()) <= 2 * _bound(a) * math.exp(2 * norm)


def test_matrix_exp_of_a_stack_and_its_derivatives():
    g = generator(0)
    a = 0.03 * torch.randn(3, 4, 4, generator=g, dtype=torch.float64)
    stacked = matrix_exp(a)  # one degree for the stack (its largest norm): each within the bound
    assert all(float((stacked[i] - matrix_exp(a[i])).abs().max()) <= _bound(a[i]) for i in range(3))
    x = (0.3 * torch.randn(3, 3, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(matrix_exp, (x,), check_forward_ad=True)


def test_derivatives_at_zero_are_exact():
    """A Newton step differentiates exp at coefficients 0, where the value alone needs no Taylor
    term: its first derivative along X must be X, its second X²."""
    g = generator(1)
    X = torch.randn(4, 4, generator=g, dtype=torch.float64)
    W = torch.randn(4, 4, generator=g, dtype=torch.float64)
    t0 = torch.zeros((), dtype=torch.float64)
    first = torch.func.jacfwd(lambda t: matrix_exp(t * X))(t0)
    second = torch.func.jacfwd(torch.func.jacrev(lambda t: (W * matrix_exp(t * X)).sum()))(t0)
    assert torch.allclose(first, X, rtol=0, atol=4 * E * float(X.abs().max()))
    assert torch.isclose(second, (W * (X @ X)).sum(), rtol=16 * E, atol=0)
