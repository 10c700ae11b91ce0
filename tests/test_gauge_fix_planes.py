"""The RoPE commutant's per-plane fix, computed for every plane at once, against the closed forms
of one plane (|w| = (‖z_k‖/‖z_q‖)^{1/2}, arg w = −arg(Σz_q²)/2, then the third-moment sign; with
a reference the phase of the fit), written here with Python's complex scalars; and the conditions
it reaches.  Zero and circular planes (Σz_q² = 0) are the special points: w = 1, margin 0."""

from __future__ import annotations

import cmath
import math

import torch

from gauge_audit.gauge_fix.heads import _plane_fixes

EPS = torch.finfo(torch.float64).eps


def _one_plane(zq: list[complex], zk: list[complex], ref=None) -> tuple[complex, float, float]:
    nq = math.sqrt(sum(abs(z) ** 2 for z in zq))
    nk = math.sqrt(sum(abs(z) ** 2 for z in zk))
    if nq == 0 or nk == 0:
        return 1 + 0j, 0.0, 0.0
    r = math.sqrt(nk / nq)
    if ref is not None:
        s = sum(a * (r * z).conjugate() for a, z in zip(ref[0], zq)) + sum(
            a * (z / r).conjugate() for a, z in zip(ref[1], zk)
        )
        scale = (
            math.sqrt(sum(abs(a) ** 2 for a in ref[0])) * r * nq + math.sqrt(sum(abs(a) ** 2 for a in ref[1])) * nk / r
        )
        return (r * s / abs(s) if abs(s) > 0 else complex(r)), abs(s) / scale, 1.0
    s2 = sum(z * z for z in zq)
    w = r * (cmath.sqrt(abs(s2) / s2) if abs(s2) > 0 else 1.0)
    cube = sum((w * z).real ** 3 for z in zq)
    total = sum(abs((w * z).real) ** 3 for z in zq)
    return (-w if cube < 0 else w), abs(s2) / nq**2, abs(cube) / total


def _columns(z: torch.Tensor) -> list[list[complex]]:
    return [[complex(v) for v in z[:, k].tolist()] for k in range(z.shape[1])]


def _planes(seed: int, n: int = 40, p: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    zq = torch.complex(
        torch.randn(n, p, generator=g, dtype=torch.float64), torch.randn(n, p, generator=g, dtype=torch.float64)
    )
    zk = torch.complex(
        torch.randn(n, p, generator=g, dtype=torch.float64), torch.randn(n, p, generator=g, dtype=torch.float64)
    )
    zq[:, 1] = 0  # a zero query plane
    zq[:, 2] = 0  # a circular one: Σ z² = 1 + i² = 0
    zq[0, 2], zq[1, 2] = 1.0, 1j
    return zq, zk


def _assert_close(got, want, n: int) -> None:
    w, pm, sm = got
    for k, (wk, pk, sk) in enumerate(want):
        tol = 16 * n * EPS * max(1.0, abs(wk))
        assert abs(complex(w[k]) - wk) <= tol, (k, complex(w[k]), wk)
        assert abs(float(pm[k]) - pk) <= 16 * n * EPS, (k, float(pm[k]), pk)
        assert abs(float(sm[k]) - sk) <= 16 * n * EPS, (k, float(sm[k]), sk)


def test_plane_fixes_are_the_one_plane_closed_forms():
    zq, zk = _planes(0)
    got = _plane_fixes(zq, zk, None)
    want = [_one_plane(q, k) for q, k in zip(_columns(zq), _columns(zk))]
    _assert_close(got, want, zq.shape[0])
    w, pm, sm = got
    assert complex(w[1]) == 1 and float(pm[1]) == 0 and float(sm[1]) == 0  # zero plane: not fixed
    assert float(pm[2]) < 16 * EPS  # circular: Σz² = 0 to rounding, phase not fixed
    assert all(float(pm[k]) > 1e-3 for k in (0, 3, 4, 5, 6))  # generic planes are fixed


def test_plane_fixes_reach_their_conditions():
    zq, zk = _planes(1)
    w, _, _ = _plane_fixes(zq, zk, None)
    live = [0, 3, 4, 5, 6]
    q, k = (w * zq)[:, live], (zk / w.conj())[:, live]
    n = zq.shape[0]
    # balanced norms, Σ (w·z_q)² real positive, positive third moment
    assert torch.allclose(q.abs().norm(dim=0), k.abs().norm(dim=0), rtol=8 * n * EPS, atol=0)
    s2 = (q * q).sum(0)
    assert (s2.imag.abs() <= 8 * n * EPS * s2.abs()).all() and (s2.real > 0).all()
    assert ((q.real**3).sum(0) > 0).all()


def test_plane_fixes_with_a_reference_are_the_phase_fit():
    zq, zk = _planes(2)
    rq, rk = _planes(3)
    got = _plane_fixes(zq, zk, (rq, rk))
    want = [_one_plane(q, k, (a, b)) for q, k, a, b in zip(_columns(zq), _columns(zk), _columns(rq), _columns(rk))]
    _assert_close(got, want, zq.shape[0])
