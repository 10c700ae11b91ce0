"""SymPy derivations that settle the algebraic claims of the catalog.

One function per claim id (``-`` → ``_``), e.g. :func:`value_g3_eq_g0`, each returning a
:class:`Derivation` (claim, verdict, derived, residual, steps, corrected_rule,
counterexample, data; ``.render()``, ``.latex``, ``.to_json()``).  :data:`DERIVATIONS`
maps claim id → function.  Verdicts are computed (simplification, solving, exact
ranks), never looked up.  Counting formulas live in :mod:`gauge_audit.symbolic.counts`.
"""

from __future__ import annotations

from ..errors import GaugeAuditError
from . import activations, attention, count_claims, nierop, norms, structure  # noqa: F401  (register)
from .activations import relu_forces_identity
from .attention import head_perm, moe_expert_perm, moe_routing, qk_gl, qk_orthogonal_only, qk_same_action, vo_gl
from .count_claims import (
    count_nierop,
    count_transformer_base,
    count_wiki_attn_params,
    count_wiki_dim_theta,
    count_wiki_log_hfact,
    fdof_bound,
    maximality_model,
)
from .nierop import nierop_eq14_transpose, value_g3_eq_g0
from .norms import ln_affine_rotation, ln_noaffine_rotation, ln_reviewer_no_fix, rmsnorm_rotation
from .registry import DERIVATIONS
from .result import FAILS, HOLDS, HOLDS_WITH_CORRECTION, VERDICTS, Derivation
from .structure import gqa_tied, gqa_wiki_formula, maximality, rope_commutant


def derive(claim_id: str) -> Derivation:
    """Run the derivation of ``claim_id`` (GaugeAuditError if there is none)."""
    try:
        fn = DERIVATIONS[claim_id]
    except KeyError:
        raise GaugeAuditError(f"no symbolic derivation for claim {claim_id!r} (see `gauge-audit derive --list`)") from None
    return fn()


# Written out (not built from DERIVATIONS) so that tools reading the source see every export;
# tests/test_symbolic.py checks that it names every derivation.
__all__ = ["DERIVATIONS", "Derivation", "FAILS", "HOLDS", "HOLDS_WITH_CORRECTION", "VERDICTS", "derive",
           "count_nierop", "count_transformer_base", "count_wiki_attn_params", "count_wiki_dim_theta",
           "count_wiki_log_hfact", "fdof_bound", "gqa_tied", "gqa_wiki_formula", "head_perm", "ln_affine_rotation",
           "ln_noaffine_rotation", "ln_reviewer_no_fix", "maximality", "maximality_model", "moe_expert_perm",
           "moe_routing", "nierop_eq14_transpose", "qk_gl", "qk_orthogonal_only", "qk_same_action",
           "relu_forces_identity", "rmsnorm_rotation", "rope_commutant", "value_g3_eq_g0", "vo_gl"]
