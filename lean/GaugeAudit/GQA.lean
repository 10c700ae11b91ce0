import GaugeAudit.Attention

/-!
# Grouped-query attention ties the query gauges

In grouped-query (and multi-query) attention several query heads read the same key head.  The
key projection `W_K` can then carry a single transformation `W_K ↦ W_K·N`, and each query head
`W_Q,i ↦ W_Q,i·M_i` must compensate it: invariance of every head's scores forces
`M_i·Nᵀ = 1`, hence `M_i = N⁻ᵀ` for all heads of the group — the group shares one gauge.
-/

namespace GaugeAudit

open MatrixAlgebra (one)

variable {Mat : Nat → Nat → Type} [MatrixAlgebra Mat]

/-- Two query heads that share the key head `W_K` (transformed by an invertible `N`, `N'·N = 1`)
and keep their scores for every input must use the same query gauge, `M₁ = M₂` (given the
cancellation hypotheses `hcancel₁`, `hcancel₂` of `qk_scores_invariant_forces_mul_tr_eq_one`)
(claim `gqa-tied`). -/
theorem gqa_tied_query_gauges {n d dk : Nat} (W_Q₁ W_Q₂ W_K : Mat d dk)
    (M₁ M₂ N N' : Mat dk dk) (hN : N' ⬝ N = one dk)
    (hcancel₁ : ∀ P Q : Mat dk dk,
      (∀ X : Mat n d, X ⬝ W_Q₁ ⬝ P ⬝ (X ⬝ W_K)ᵀ = X ⬝ W_Q₁ ⬝ Q ⬝ (X ⬝ W_K)ᵀ) → P = Q)
    (hcancel₂ : ∀ P Q : Mat dk dk,
      (∀ X : Mat n d, X ⬝ W_Q₂ ⬝ P ⬝ (X ⬝ W_K)ᵀ = X ⬝ W_Q₂ ⬝ Q ⬝ (X ⬝ W_K)ᵀ) → P = Q)
    (hinv₁ : ∀ X : Mat n d, (X ⬝ W_Q₁ ⬝ M₁) ⬝ (X ⬝ W_K ⬝ N)ᵀ = (X ⬝ W_Q₁) ⬝ (X ⬝ W_K)ᵀ)
    (hinv₂ : ∀ X : Mat n d, (X ⬝ W_Q₂ ⬝ M₂) ⬝ (X ⬝ W_K ⬝ N)ᵀ = (X ⬝ W_Q₂) ⬝ (X ⬝ W_K)ᵀ) :
    M₁ = M₂ :=
  (MatrixAlgebra.eq_inv_tr_of_mul_tr_eq_one
      (qk_scores_invariant_forces_mul_tr_eq_one W_Q₁ W_K M₁ N hcancel₁ hinv₁) hN).trans
    (MatrixAlgebra.eq_inv_tr_of_mul_tr_eq_one
      (qk_scores_invariant_forces_mul_tr_eq_one W_Q₂ W_K M₂ N hcancel₂ hinv₂) hN).symm

/-- Conversely the tied choice `M₁ = M₂ = N⁻ᵀ` (with `N·N' = 1`) keeps every query head's
scores, for every input (claim `gqa-tied`). -/
theorem gqa_tied_gauge_preserves_scores {n d dk : Nat} (X : Mat n d) (W_Q W_K : Mat d dk)
    (N N' : Mat dk dk) (hN : N ⬝ N' = one dk) :
    (X ⬝ W_Q ⬝ N'ᵀ) ⬝ (X ⬝ W_K ⬝ N)ᵀ = (X ⬝ W_Q) ⬝ (X ⬝ W_K)ᵀ := by
  rw [MatrixAlgebra.tr_mul (X ⬝ W_K) N, MatrixAlgebra.mul_assoc (X ⬝ W_Q) N'ᵀ,
    ← MatrixAlgebra.mul_assoc N'ᵀ Nᵀ, ← MatrixAlgebra.tr_mul N N', hN,
    MatrixAlgebra.tr_one dk, MatrixAlgebra.one_mul]

end GaugeAudit
