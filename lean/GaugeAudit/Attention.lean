import GaugeAudit.MatrixAlgebra
import GaugeAudit.Concrete

/-!
# Query–key gauge freedom of attention scores

For one head with input `X` (`n × d`), query and key weights `W_Q`, `W_K` (`d × d_k`), the
attention scores are `S = (X·W_Q)·(X·W_K)ᵀ`; softmax, scaling and masking act on `S` only, so
a transformation that leaves `S` unchanged leaves the head unchanged.

* `qk_scores_invariant`: `W_Q ↦ W_Q·M`, `W_K ↦ W_K·M⁻ᵀ` preserves `S` for **every** invertible
  `M` (the `GL(d_k)` symmetry), so the claim that only orthogonal `M` work is false;
  `qk_nonorthogonal_shear_preserves_scores` exhibits a non-orthogonal integer `M`.
* With the *same* action `W_K ↦ W_K·M` the scores are preserved when `M·Mᵀ = 1`
  (`qk_same_action_invariant_of_orthogonal`) and, under a cancellation hypothesis, only then
  (`qk_same_action_requires_orthogonal`); `qk_same_action_changes_scores_diag` is a concrete
  non-orthogonal `M` that changes them.
* van Nierop's eq. (14): with `Ē ↦ g·Ē`, `Q ↦ h₁·Q·g₁`, `K ↦ h₂·K·g₂` the scores
  `(QĒ)ᵀ(KĒ)` are preserved for `g₁ = g₂ = g⁻¹` (no transpose) and `h₂ᵀ = h₁⁻¹`; the
  transposed placement `g₁ = g₂ = g⁻ᵀ` fails off the orthogonal group.
-/

namespace GaugeAudit

open MatrixAlgebra (one)

section General

variable {Mat : Nat → Nat → Type} [MatrixAlgebra Mat]

/-- Attention scores are unchanged by `W_Q ↦ W_Q·M`, `W_K ↦ W_K·M⁻ᵀ` for every invertible `M`
(here `M' = M⁻¹`, so `M'ᵀ = M⁻ᵀ`): `(X·W_Q·M)·(X·W_K·M⁻ᵀ)ᵀ = (X·W_Q)·(X·W_K)ᵀ`
(claim `qk-gl`).  Since `M` need not be orthogonal, this refutes "only orthogonal `M`
preserve the scores" (claim `qk-orthogonal-only`, refutes). -/
theorem qk_scores_invariant {n d dk : Nat} (X : Mat n d) (W_Q W_K : Mat d dk)
    (M M' : Mat dk dk) (hM : M ⬝ M' = one dk) :
    (X ⬝ W_Q ⬝ M) ⬝ (X ⬝ W_K ⬝ M'ᵀ)ᵀ = (X ⬝ W_Q) ⬝ (X ⬝ W_K)ᵀ := by
  rw [MatrixAlgebra.tr_mul (X ⬝ W_K) M'ᵀ, MatrixAlgebra.tr_tr M',
    MatrixAlgebra.mul_assoc (X ⬝ W_Q) M, ← MatrixAlgebra.mul_assoc M M', hM,
    MatrixAlgebra.one_mul]

/-- With the same action `W_Q ↦ W_Q·M`, `W_K ↦ W_K·M`, an orthogonal `M` (`M·Mᵀ = 1`) leaves
the scores unchanged (claim `qk-same-action`, context). -/
theorem qk_same_action_invariant_of_orthogonal {n d dk : Nat} (X : Mat n d)
    (W_Q W_K : Mat d dk) (M : Mat dk dk) (hM : M ⬝ Mᵀ = one dk) :
    (X ⬝ W_Q ⬝ M) ⬝ (X ⬝ W_K ⬝ M)ᵀ = (X ⬝ W_Q) ⬝ (X ⬝ W_K)ᵀ := by
  rw [MatrixAlgebra.tr_mul (X ⬝ W_K) M, MatrixAlgebra.mul_assoc (X ⬝ W_Q) M,
    ← MatrixAlgebra.mul_assoc M Mᵀ, hM, MatrixAlgebra.one_mul]

/-- If `W_Q ↦ W_Q·M`, `W_K ↦ W_K·N` preserves the scores for every input `X`, and the score
map `P ↦ (X·W_Q)·P·(X·W_K)ᵀ` (over all `X`) separates `d_k × d_k` matrices (hypothesis
`hcancel`; it holds when `W_Q`, `W_K` have full column rank), then `M·Nᵀ = 1`, i.e.
`N = M⁻ᵀ`.  Used for `qk-same-action` and `gqa-tied`. -/
theorem qk_scores_invariant_forces_mul_tr_eq_one {n d dk : Nat} (W_Q W_K : Mat d dk)
    (M N : Mat dk dk)
    (hcancel : ∀ P Q : Mat dk dk,
      (∀ X : Mat n d, X ⬝ W_Q ⬝ P ⬝ (X ⬝ W_K)ᵀ = X ⬝ W_Q ⬝ Q ⬝ (X ⬝ W_K)ᵀ) → P = Q)
    (hinv : ∀ X : Mat n d, (X ⬝ W_Q ⬝ M) ⬝ (X ⬝ W_K ⬝ N)ᵀ = (X ⬝ W_Q) ⬝ (X ⬝ W_K)ᵀ) :
    M ⬝ Nᵀ = one dk := by
  apply hcancel
  intro X
  rw [MatrixAlgebra.mul_one (X ⬝ W_Q), ← hinv X, MatrixAlgebra.tr_mul (X ⬝ W_K) N,
    MatrixAlgebra.mul_assoc (X ⬝ W_Q) (M ⬝ Nᵀ), MatrixAlgebra.mul_assoc M Nᵀ,
    MatrixAlgebra.mul_assoc (X ⬝ W_Q) M]

/-- Under the same-action rule `W_Q ↦ W_Q·M`, `W_K ↦ W_K·M`, invariance of the scores for all
inputs forces `M` to be orthogonal, `M·Mᵀ = 1` (given the cancellation hypothesis `hcancel`)
(claim `qk-same-action`, refutes). -/
theorem qk_same_action_requires_orthogonal {n d dk : Nat} (W_Q W_K : Mat d dk)
    (M : Mat dk dk)
    (hcancel : ∀ P Q : Mat dk dk,
      (∀ X : Mat n d, X ⬝ W_Q ⬝ P ⬝ (X ⬝ W_K)ᵀ = X ⬝ W_Q ⬝ Q ⬝ (X ⬝ W_K)ᵀ) → P = Q)
    (hinv : ∀ X : Mat n d, (X ⬝ W_Q ⬝ M) ⬝ (X ⬝ W_K ⬝ M)ᵀ = (X ⬝ W_Q) ⬝ (X ⬝ W_K)ᵀ) :
    M ⬝ Mᵀ = one dk :=
  qk_scores_invariant_forces_mul_tr_eq_one W_Q W_K M M hcancel hinv

/-- van Nierop's eq. (14), correctly placed: with `Ē ↦ g·Ē`, `Q ↦ h₁·Q·g₁`, `K ↦ h₂·K·g₂`,
the scores `(Q·Ē)ᵀ·(K·Ē)` are unchanged for `g₁ = g₂ = g⁻¹` (here `g'` with `g'·g = 1`), with
no transpose on `g₁`, `g₂`, and `h₁ᵀ·h₂ = 1`, i.e. `h₂ᵀ = h₁⁻¹` as printed
(claim `nierop-eq14-transpose`, corrects). -/
theorem nierop_eq14_corrected {n de dh : Nat} (Ebar : Mat de n) (Q K : Mat dh de)
    (g g' : Mat de de) (h₁ h₂ : Mat dh dh) (hg : g' ⬝ g = one de) (hh : h₁ᵀ ⬝ h₂ = one dh) :
    (h₁ ⬝ Q ⬝ g' ⬝ (g ⬝ Ebar))ᵀ ⬝ (h₂ ⬝ K ⬝ g' ⬝ (g ⬝ Ebar)) = (Q ⬝ Ebar)ᵀ ⬝ (K ⬝ Ebar) := by
  rw [MatrixAlgebra.mul_assoc (h₁ ⬝ Q) g', MatrixAlgebra.mul_assoc (h₂ ⬝ K) g',
    ← MatrixAlgebra.mul_assoc g' g Ebar, hg, MatrixAlgebra.one_mul Ebar,
    MatrixAlgebra.mul_assoc h₁ Q Ebar, MatrixAlgebra.mul_assoc h₂ K Ebar,
    MatrixAlgebra.tr_mul h₁ (Q ⬝ Ebar), MatrixAlgebra.mul_assoc (Q ⬝ Ebar)ᵀ h₁ᵀ,
    ← MatrixAlgebra.mul_assoc h₁ᵀ h₂, hh, MatrixAlgebra.one_mul (K ⬝ Ebar)]

end General

section Concrete

/-- A concrete non-orthogonal `M` for which the same action changes the scores: with
`X·W_Q = X·W_K = 1` and `M = diag(2, 1)` the scores become `M·Mᵀ = diag(4, 1) ≠ 1`
(claim `qk-same-action`, refutes). -/
theorem qk_same_action_changes_scores_diag :
    Mat2.mul (Mat2.mul id2 diag21) (Mat2.tr (Mat2.mul id2 diag21)) ≠
      Mat2.mul id2 (Mat2.tr id2) :=
  Mat2.ne_of_a_ne (by decide)

/-- A non-orthogonal `M` that preserves the scores: the shear `M = [[1, 1], [0, 1]]` has
`M·Mᵀ ≠ 1` and inverse `[[1, -1], [0, 1]]`, and `W_Q ↦ W_Q·M`, `W_K ↦ W_K·M⁻ᵀ` leaves the
scores of a sample input unchanged (claim `qk-orthogonal-only`, refutes). -/
theorem qk_nonorthogonal_shear_preserves_scores :
    Mat2.mul shear (Mat2.tr shear) ≠ id2 ∧ Mat2.mul shear shearInv = id2 ∧
      Mat2.mul (Mat2.mul sampleQ shear) (Mat2.tr (Mat2.mul sampleK (Mat2.tr shearInv))) =
        Mat2.mul sampleQ (Mat2.tr sampleK) :=
  ⟨Mat2.ne_of_a_ne (by decide), rfl, rfl⟩

/-- The transposed placement of eq. (14), `g₁ = g₂ = g⁻ᵀ`, does not preserve the scores once
`g` is not orthogonal: for the shear `g` and `Q = K = Ē = 1` the scores become
`[[2, 1], [1, 1]] ≠ 1` (claim `nierop-eq14-transpose`, refutes). -/
theorem nierop_eq14_transposed_placement_fails :
    Mat2.mul (Mat2.tr (Mat2.mul (Mat2.mul id2 (Mat2.tr shearInv)) (Mat2.mul shear id2)))
        (Mat2.mul (Mat2.mul id2 (Mat2.tr shearInv)) (Mat2.mul shear id2)) ≠
      Mat2.mul (Mat2.tr (Mat2.mul id2 id2)) (Mat2.mul id2 id2) :=
  Mat2.ne_of_a_ne (by decide)

end Concrete

end GaugeAudit
