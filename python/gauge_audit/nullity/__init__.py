"""Maximality audit: the dimension of the symmetry group, measured and explained.

The measured dimension is the nullity of the output Jacobian at a generic point
(:mod:`.measure`); the theory is a list of symmetry families with dimension formulas
and exact generators (:mod:`.generators`); :mod:`.explain` checks every generator
and reports what is left unexplained; :mod:`.matrixfree` certifies the same nullity
without forming J; :mod:`.analysis` ties it together with the papers' counts and the
per-family maximality verdict.
"""

from .analysis import (MaximalityVerdict, NullityReport, analyze, gmax_dimension, maximality_verdicts, paper_counts,
                       standard_configs, verdict)

__all__ = ["MaximalityVerdict", "NullityReport", "analyze", "gmax_dimension", "maximality_verdicts", "paper_counts",
           "standard_configs", "verdict"]
