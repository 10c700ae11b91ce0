"""Evaluate a parsed rule expression (:class:`gauge_audit.claims.matexpr.Node`) on one of three
number systems, with one evaluator:

* :class:`TorchOps` — float64 torch tensors (the torch checker, the testing API, and — through
  forward-mode differentiation — the rule's generators for the nullity checker);
* :class:`SympyOps` — SymPy matrices with symbolic entries (the symbolic checker);
* :class:`ListOps` — nested Python lists of ``Fraction`` (exact), ``mpf`` (working precision)
  or intervals, with :mod:`gauge_audit.precision.linalg` (the precision checker).

Every value is a 2-D matrix (a vector is a 1×n row, a scalar 1×1); shapes are checked at every
operation, so a rule whose numeric dimension does not fit a model fails with one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction

import sympy as sp
import torch

from ..claims.matexpr import Node
from ..errors import GaugeAuditError
from ..precision import linalg as la
from ..runtime import stacked_inv

PERMUTATION_MIN = 64  # a square factor at least this wide is tested for being a signed permutation (gathered)
SINGULAR_LIMIT = 1e14  # κ beyond which a float64 inverse is refused (as for user-supplied elements)


def _shape_error(op: str, a, b) -> GaugeAuditError:
    return GaugeAuditError(f"shape mismatch in '{op}': {a[0]}×{a[1]} and {b[0]}×{b[1]}")


class Ops:
    """The operations a rule expression needs; subclasses fix the number system."""

    def shape(self, a) -> tuple[int, int]:
        raise NotImplementedError

    def dense(self, a):
        """A value in its plain form (torch keeps diagonal matrices as vectors until here)."""
        return a

    def check_product(self, a, b) -> None:
        if self.shape(a)[1] != self.shape(b)[0]:
            raise _shape_error("@", self.shape(a), self.shape(b))

    def check_same(self, op: str, a, b) -> None:
        if self.shape(a) != self.shape(b):
            raise _shape_error(op, self.shape(a), self.shape(b))

    def vector(self, v) -> list:
        """The entries of a 1×n or n×1 value."""
        raise NotImplementedError

    # The arithmetic every number system provides (each subclass implements all of them).
    def num(self, q: Fraction):
        raise NotImplementedError

    def mul(self, a, b):
        raise NotImplementedError

    def add(self, a, b):
        raise NotImplementedError

    def transpose(self, a):
        raise NotImplementedError

    def diag(self, v):
        raise NotImplementedError

    def ones(self, n: int):
        raise NotImplementedError

    def eye(self, n: int):
        raise NotImplementedError

    def cond(self, a) -> float:
        raise NotImplementedError


class Diag:
    """A diagonal matrix kept as its diagonal (torch): diag(s) of a 1536-wide FFN costs a vector,
    not a dense 1536×1536 product or inverse."""

    def __init__(self, v: torch.Tensor):
        self.v = v.reshape(-1)

    @property
    def shape(self):
        return (self.v.shape[0], self.v.shape[0])

    def dense(self) -> torch.Tensor:
        return torch.diag(self.v)


def _signed_permutation(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``a`` as a permutation matrix up to signs — entries 0 and ±1 only, one ±1 in every row and
    column — given by (the column of each row's ±1, that ±1); None if it is not one.  (A
    permutation of the rule's group, or a product of them: its SVD on d_ff = 1536 takes a second,
    once per layer, and its dense product 1.4 GFLOP.)  A dense matrix fails at the first count."""
    n = a.shape[0]
    if a.dim() != 2 or a.shape[1] != n or int(torch.count_nonzero(a)) != n:
        return None
    if not a.is_contiguous():
        if not a.T.is_contiguous():
            a = a.contiguous()
        else:  # a transpose (transpose(P) in a rule): read its contiguous original, whose rows are its columns
            found = _signed_permutation(a.T)
            if found is None:
                return None
            # row k of aᵀ has its ±1 in column cols_t[k]: so does column k of a, in row cols_t[k]
            cols_t, vals_t = found
            cols = torch.argsort(cols_t)
            return cols, vals_t[cols]
    # the n non-zeros in row-major order (no n×n temporary): one in every row, each ±1, and one
    # in every column
    rows, cols = torch.nonzero(a, as_tuple=True)
    if not bool((rows == torch.arange(n, device=a.device)).all()):
        return None
    vals = a[rows, cols]
    if not bool((vals.abs() == 1).all()) or not bool((torch.bincount(cols, minlength=n) == 1).all()):
        return None
    return cols, vals


class TorchOps(Ops):
    """float64 tensors.  ``check_singular``: refuse an inverse of a numerically singular matrix
    (off inside forward-mode differentiation, where the primal was checked already).
    ``tangents``: the values carry forward-mode tangents (``torch.func.jvp``): every product is
    dense, since a factor that is a permutation at the primal (the identity element) has a tangent
    that a gather would drop."""

    def __init__(self, check_singular: bool = True, device=None, tangents: bool = False):
        self.check_singular = check_singular
        self.device = device
        self.tangents = tangents

    def _permutation(self, m: torch.Tensor):
        """``m`` as a signed permutation to gather by, or None (also whenever m may be differentiated)."""
        if self.tangents or m.shape[0] < PERMUTATION_MIN or (m.requires_grad and torch.is_grad_enabled()):
            return None
        return _signed_permutation(m)

    def shape(self, a):
        return tuple(a.shape)

    def dense(self, a):
        return a.dense() if isinstance(a, Diag) else a

    def num(self, q: Fraction):
        return torch.tensor([[float(q)]], dtype=torch.float64, device=self.device)

    def matmul(self, a, b):
        self.check_product(a, b)
        if isinstance(a, Diag) and isinstance(b, Diag):
            return Diag(a.v * b.v)
        if isinstance(b, Diag):
            return a * b.v[None, :]
        if isinstance(a, Diag):
            return a.v[:, None] * b
        # x·P and P·x for a permutation P (up to signs) of the FFN's 1536 hidden units: a gather,
        # exact (every entry of the product is one entry of x times ±1), O(n²) not O(n³)
        perm = self._permutation(b)
        if perm is not None:
            cols, vals = perm  # column j of x·P is x[:, k]·P[k, j] for the row k with cols[k] = j
            k = torch.argsort(cols)
            return a[:, k] * vals[k][None, :]
        perm = self._permutation(a)
        if perm is not None:
            cols, vals = perm  # row i of P·x is P[i, cols[i]]·x[cols[i], :]
            return b[cols, :] * vals[:, None]
        return a @ b

    def mul(self, a, b):
        if self.shape(a) == (1, 1) and isinstance(b, Diag):
            return Diag(a.reshape(()) * b.v)
        if self.shape(b) == (1, 1) and isinstance(a, Diag):
            return Diag(b.reshape(()) * a.v)
        a, b = self.dense(a), self.dense(b)
        if self.shape(a) == (1, 1) or self.shape(b) == (1, 1):
            return a * b
        self.check_same("*", a, b)
        return a * b

    def add(self, a, b):
        self.check_same("+", a, b)
        return self.dense(a) + self.dense(b)

    def sub(self, a, b):
        self.check_same("-", a, b)
        return self.dense(a) - self.dense(b)

    def neg(self, a):
        return Diag(-a.v) if isinstance(a, Diag) else -a

    def cond(self, a) -> float:
        """2-norm condition number (1 for a 1×1 or non-square value)."""
        if isinstance(a, Diag):
            m = a.v.detach().abs()
            return float(m.max() / m.min()) if float(m.min()) > 0 else float("inf")
        if a.shape[0] != a.shape[1] or a.shape[0] == 1:
            return 1.0
        if _signed_permutation(a.detach()) is not None:
            return 1.0  # orthogonal: every singular value is exactly 1 (what svdvals returns too), O(n²)
        sv = torch.linalg.svdvals(a.detach())
        return float(sv[0] / sv[-1]) if float(sv[-1]) > 0 else float("inf")

    def inv(self, a):
        r, c = self.shape(a)
        if r != c:
            raise GaugeAuditError(f"inv() of a non-square {r}×{c} matrix")
        if self.check_singular:
            with torch.no_grad():
                k = self.cond(a) if r > 1 else (float("inf") if float(self.dense(a).abs().max()) == 0 else 1.0)
            if not (k < SINGULAR_LIMIT):
                raise GaugeAuditError(f"a matrix inverted by the rule is singular (condition number {k:.3g})")
        if isinstance(a, Diag):
            return Diag(1.0 / a.v)
        return stacked_inv(a)

    def transpose(self, a):
        return a if isinstance(a, Diag) else a.transpose(0, 1)

    def diag(self, v):
        return Diag(v)

    def ones(self, n: int):
        return torch.ones(1, n, dtype=torch.float64, device=self.device)

    def eye(self, n: int):
        return Diag(torch.ones(n, dtype=torch.float64, device=self.device))

    def outer(self, u, v):
        return u.reshape(-1, 1) @ v.reshape(1, -1)

    def vector(self, v):
        return v.reshape(-1)


_NOT_FINITE = (sp.zoo, sp.oo, -sp.oo, sp.nan)


def sym_matmul(a: sp.Matrix, b: sp.Matrix) -> sp.Matrix:
    """a·b for SymPy matrices: each entry Add(*[a_ik·b_kj]) over the k where neither factor is an
    exact 0 — the sum SymPy's own product forms, without its checks of 0·x for an infinite x (each
    builds 0·x and asks whether x is finite: on the symbolic checker's block identities, where
    identities, RoPE blocks and stream maps are mostly zeros, a third of its time).  A matrix with
    an infinity or NaN in it (0·∞ is NaN, not 0) goes through SymPy's own product."""
    n, k = a.shape
    k2, m = b.shape
    if k != k2:
        raise _shape_error("@", a.shape, b.shape)
    if a.has(*_NOT_FINITE) or b.has(*_NOT_FINITE):
        return a * b
    rows = [[(j, x) for j, x in enumerate(row) if x != 0] for row in a.tolist()]
    cols = [{j: x for j, x in enumerate(col) if x != 0} for col in b.T.tolist()]
    return sp.Matrix(n, m, [sp.Add(*[x * col[j] for j, x in row if j in col]) for row in rows for col in cols])


class SympyOps(Ops):
    """SymPy matrices; inverses by the adjugate (entries stay rational functions)."""

    def shape(self, a):
        return a.shape

    def num(self, q: Fraction):
        return sp.Matrix([[sp.Rational(q.numerator, q.denominator)]])

    def matmul(self, a, b):
        self.check_product(a, b)
        return sym_matmul(a, b)

    def mul(self, a, b):
        if self.shape(a) == (1, 1):
            return a[0, 0] * b
        if self.shape(b) == (1, 1):
            return b[0, 0] * a
        self.check_same("*", a, b)
        return a.multiply_elementwise(b)

    def add(self, a, b):
        self.check_same("+", a, b)
        return a + b

    def sub(self, a, b):
        self.check_same("-", a, b)
        return a - b

    def neg(self, a):
        return -a

    def inv(self, a):
        r, c = self.shape(a)
        if r != c:
            raise GaugeAuditError(f"inv() of a non-square {r}×{c} matrix")
        if a.is_diagonal():
            return sp.diag(*[1 / a[i, i] for i in range(r)])
        det = sp.factor(a.det())
        if det == 0:
            raise GaugeAuditError("a matrix inverted by the rule is singular (determinant 0)")
        return a.adjugate() / det

    def transpose(self, a):
        return a.T

    def diag(self, v):
        return sp.diag(*list(v))

    def ones(self, n: int):
        return sp.ones(1, n)

    def eye(self, n: int):
        return sp.eye(n)

    def outer(self, u, v):
        return sp.Matrix(list(u)) * sp.Matrix(list(v)).T

    def vector(self, v):
        return list(v)


class ListOps(Ops):
    """Nested lists of numbers of one kind: ``num`` converts a Fraction (and 0, 1) into it."""

    def __init__(self, num: Callable[[Fraction], object]):
        self._num = num

    def shape(self, a):
        return (len(a), len(a[0]))

    def num(self, q: Fraction):
        return [[self._num(q)]]

    def matmul(self, a, b):
        self.check_product(a, b)
        return la.matmul(a, b)

    def mul(self, a, b):
        if self.shape(a) == (1, 1):
            return la.scale(b, a[0][0])
        if self.shape(b) == (1, 1):
            return la.scale(a, b[0][0])
        self.check_same("*", a, b)
        return [[x * y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]

    def add(self, a, b):
        self.check_same("+", a, b)
        return la.add(a, b)

    def sub(self, a, b):
        self.check_same("-", a, b)
        return la.sub(a, b)

    def neg(self, a):
        return [[-x for x in row] for row in a]

    def inv(self, a):
        return la.inverse(a)

    def transpose(self, a):
        return la.transpose(a)

    def diag(self, v):
        vals = self.vector(v)
        zero = self._num(Fraction(0))
        return [[vals[i] if i == j else zero for j in range(len(vals))] for i in range(len(vals))]

    def ones(self, n: int):
        return [[self._num(Fraction(1))] * n]

    def eye(self, n: int):
        one, zero = self._num(Fraction(1)), self._num(Fraction(0))
        return la.identity(n, one, zero)

    def outer(self, u, v):
        return [[x * y for y in self.vector(v)] for x in self.vector(u)]

    def vector(self, v):
        return v[0] if len(v) == 1 else [row[0] for row in v]


def evaluate(node: Node, env: Mapping[str, object], ops: Ops, dims: Mapping[str, int]):
    """The value of ``node`` with names bound by ``env`` and dimension names by ``dims``."""
    op = node.op
    if op == "name":
        assert node.name is not None  # the parser sets name, value and dim on the nodes that have them
        return env[node.name]
    if op == "num":
        assert node.value is not None
        return ops.num(node.value)
    if op in ("ones", "eye"):
        n = dims[node.dim] if isinstance(node.dim, str) else node.dim
        assert n is not None
        return ops.ones(n) if op == "ones" else ops.eye(n)
    args = [evaluate(a, env, ops, dims) for a in node.args]
    if op == "diag":
        v = args[0]
        if 1 not in ops.shape(v):
            raise GaugeAuditError(f"diag() of a {ops.shape(v)[0]}×{ops.shape(v)[1]} matrix")
        return ops.diag(v)
    return getattr(ops, op)(*args)


__all__ = ["Diag", "ListOps", "Ops", "SympyOps", "TorchOps", "evaluate"]
