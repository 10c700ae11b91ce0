"""Gauge fixing: one canonical representative per symmetry orbit, and comparing two models
up to the whole symmetry group.

* :func:`canonicalize` — (Config, params) → :class:`Canonical`: the canonical parameters g·θ, the
  explicit element g (a composite of the actions' elements), every gauge condition imposed and
  every non-uniqueness met;
* :func:`conditions` — the imposed conditions as differentiable functions (their number equals the
  explained nullity, family by family: ``tests/test_gauge_fix.py``);
* :func:`compare` — is B a gauge-transformed copy of A?  Distances before and after
  canonicalisation, a verdict against a tolerance derived from both models' storage precision,
  and the element mapping A to B.

Modules: :mod:`.base` (records, decisions, shared linear algebra), :mod:`.stream` (norms, biases,
stream), :mod:`.heads` (attention), :mod:`.ffn` (FFN and experts), :mod:`.pipeline` (the order),
:mod:`.comparison` (with :mod:`.response`, its rounding probes, and :mod:`.streamed`, model B one
run of blocks at a time).
"""

from .comparison import DIFFERENT, EQUIVALENT, UNDECIDED, Comparison, Prepared, compare, prepare
from .pipeline import Canonical, canonicalize, conditions, function_check, unfixed

__all__ = [
    "DIFFERENT",
    "UNDECIDED",
    "EQUIVALENT",
    "Canonical",
    "Comparison",
    "Prepared",
    "canonicalize",
    "compare",
    "conditions",
    "function_check",
    "prepare",
    "unfixed",
]
