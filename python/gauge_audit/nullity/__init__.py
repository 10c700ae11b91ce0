"""Maximality audit: the dimension of the symmetry group, measured and explained.

The measured dimension is the nullity of the output Jacobian at a generic point
(:mod:`.measure`); the theory is a list of symmetry families with dimension formulas
and exact generators (:mod:`.families`, one module per kind); :mod:`.explain` checks
every generator and reports what is left unexplained; :mod:`.matrixfree` certifies the
same nullity without forming J; :mod:`.report` holds the result with the papers' counts
and the per-family maximality verdict; :mod:`.cost` estimates memory and time before any
work starts; :mod:`.analysis` runs it end to end.

Imports point one way: analysis → matrixfree → report → explain → families → measure → cost
(each imports only modules to its right).
"""

from .analysis import analyze, maximality_verdicts, standard_configs
from .report import MaximalityVerdict, NullityReport, gmax_dimension, paper_counts, verdict

__all__ = [
    "MaximalityVerdict",
    "NullityReport",
    "analyze",
    "gmax_dimension",
    "maximality_verdicts",
    "paper_counts",
    "standard_configs",
    "verdict",
]
