"""The derivation registry and shared helpers (catalog access, coefficient solving)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import sympy as sp

from ..claims import Claim, load_catalog
from ..errors import GaugeAuditError
from .result import Derivation

DERIVATIONS: dict[str, Callable[[], Derivation]] = {}


def derivation(claim_id: str):
    """Register ``fn`` as the derivation of ``claim_id``; its name must be the id with - → _."""

    def deco(fn):
        if fn.__name__ != claim_id.replace("-", "_"):
            raise AssertionError(f"derivation for {claim_id} must be named {claim_id.replace('-', '_')}")
        DERIVATIONS[claim_id] = fn
        return fn

    return deco


@lru_cache(maxsize=1)
def _catalog():
    return load_catalog()


def claim(claim_id: str) -> Claim:
    try:
        return _catalog()[claim_id]
    except KeyError:
        raise GaugeAuditError(f"claim {claim_id!r} is not in the catalog") from None


def sym_matrix(name: str, rows: int, cols: int, **assumptions) -> sp.Matrix:
    """A matrix whose entries are all independent symbols name_ij."""
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}{j}", **assumptions))


def coefficient_equations(residual: sp.Matrix, data_symbols) -> list[sp.Expr]:
    """Equations (= 0) on the unknowns that make ``residual`` vanish identically in the data.

    Every entry is expanded as a polynomial in ``data_symbols`` (inputs and weights, which
    are arbitrary) and each coefficient must vanish."""
    eqs: list[sp.Expr] = []
    data_symbols = list(data_symbols)
    for entry in residual:
        entry = sp.expand(entry)
        if entry == 0:
            continue
        for coeff in sp.Poly(entry, *data_symbols).coeffs():
            coeff = sp.factor(coeff)
            if coeff != 0 and coeff not in eqs and -coeff not in eqs:
                eqs.append(coeff)
    return eqs


def is_zero_matrix(m) -> bool:
    return all(sp.simplify(x) == 0 for x in m)
