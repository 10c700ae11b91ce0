"""SymPy derivations that settle the algebraic claims of the catalog.

One function per claim id (``-`` → ``_``), e.g. :func:`value_g3_eq_g0`, each returning a
:class:`Derivation` (claim, verdict, derived, residual, steps, corrected_rule,
counterexample, data; ``.render()``, ``.latex``, ``.to_json()``).  :data:`DERIVATIONS`
maps claim id → function.  Verdicts are computed (simplification, solving, exact
ranks), never looked up.  Counting formulas live in :mod:`gauge_audit.symbolic.counts`.
"""

from __future__ import annotations

from ..errors import GaugeAuditError
from . import activations, attention, count_claims, nierop, norms, source_checks, structure, wiki_checks  # noqa: F401
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
from .source_checks import (
    hg_savings,
    mgs_relative_encodings,
    nierop_eq14_h,
    nierop_linear_layer_condition,
    nierop_skip_rotations,
    nierop_skip_ties,
    nierop_table1_arithmetic,
    pith_ln_sphere,
    pith_so_stabilizer_dim,
    review_g3_inverse,
)
from .structure import gqa_tied, gqa_wiki_formula, maximality, rope_commutant
from .wiki_checks import (
    wiki_eps_mach,
    wiki_gmax_infinite,
    wiki_gpt2_110m,
    wiki_gpt2_redundancy_table,
    wiki_gqa_dim_table,
    wiki_gqa_percent_table,
    wiki_lora_subgroup,
    wiki_orbit_stability,
    wiki_qk_lemma1,
    wiki_rank_bound,
    wiki_rope_relative,
    wiki_theorem3_left_action,
    wiki_vo_convention,
)


def derive(claim_id: str) -> Derivation:
    """Run the derivation of ``claim_id`` (GaugeAuditError if there is none)."""
    try:
        fn = DERIVATIONS[claim_id]
    except KeyError:
        raise GaugeAuditError(
            f"no symbolic derivation for claim {claim_id!r} (see `gauge-audit derive --list`)"
        ) from None
    return fn()


# Written out (not built from DERIVATIONS) so that tools reading the source see every export;
# tests/test_symbolic.py checks that it names every derivation.
__all__ = [
    "DERIVATIONS",
    "Derivation",
    "FAILS",
    "HOLDS",
    "HOLDS_WITH_CORRECTION",
    "VERDICTS",
    "count_nierop",
    "count_transformer_base",
    "count_wiki_attn_params",
    "count_wiki_dim_theta",
    "count_wiki_log_hfact",
    "derive",
    "fdof_bound",
    "gqa_tied",
    "gqa_wiki_formula",
    "head_perm",
    "hg_savings",
    "ln_affine_rotation",
    "ln_noaffine_rotation",
    "ln_reviewer_no_fix",
    "maximality",
    "maximality_model",
    "mgs_relative_encodings",
    "moe_expert_perm",
    "moe_routing",
    "nierop_eq14_h",
    "nierop_eq14_transpose",
    "nierop_linear_layer_condition",
    "nierop_skip_rotations",
    "nierop_skip_ties",
    "nierop_table1_arithmetic",
    "pith_ln_sphere",
    "pith_so_stabilizer_dim",
    "qk_gl",
    "qk_orthogonal_only",
    "qk_same_action",
    "relu_forces_identity",
    "review_g3_inverse",
    "rmsnorm_rotation",
    "rope_commutant",
    "value_g3_eq_g0",
    "vo_gl",
    "wiki_eps_mach",
    "wiki_gmax_infinite",
    "wiki_gpt2_110m",
    "wiki_gpt2_redundancy_table",
    "wiki_gqa_dim_table",
    "wiki_gqa_percent_table",
    "wiki_lora_subgroup",
    "wiki_orbit_stability",
    "wiki_qk_lemma1",
    "wiki_rank_bound",
    "wiki_rope_relative",
    "wiki_theorem3_left_action",
    "wiki_vo_convention",
]
