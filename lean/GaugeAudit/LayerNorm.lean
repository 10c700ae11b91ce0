import GaugeAudit.MatrixAlgebra
import GaugeAudit.Concrete

/-!
# LayerNorm's affine part and rotations of the residual stream

LayerNorm with learned parameters is `LN(x) = γ ⊙ z + β` with `z` the normalized vector.
van Nierop rotates the embeddings by `g ∈ SO(d_e − 1)` (rotations fixing the all-ones
direction) and assumes `LN(g·x) = g·LN(x)`.  The normalization commutes with such `g`, but
the learned scale does not: `γ ⊙ (g·u) ≠ g·(γ ⊙ u)` in general
(`ln_gamma_does_not_commute_with_rotation`, with a 120° rotation about the all-ones axis).

The corrected rule moves `γ` and `β` into the *reader*: a matrix `W` that reads
`γ ⊙ z + β = D·z + β` (`D = diag γ`) sees exactly the same values when the stream carries
`g·z` and the reader is replaced by `W·D·g⁻¹` plus the fixed bias `W·β`
(`ln_reader_absorbs_affine`).
-/

namespace GaugeAudit

open MatrixAlgebra (one)

/-- The learned scale `γ = (1, 2, 3)` of the counterexample. -/
def gammaSample : Vec3 := ⟨1, 2, 3⟩

/-- A centered direction `u = (1, -1, 0)` (mean zero, so it is a LayerNorm output direction). -/
def centeredSample : Vec3 := ⟨1, -1, 0⟩

/-- The rotation `g = cycle` fixes the all-ones vector, yet `γ ⊙ (g·u) ≠ g·(γ ⊙ u)` for
`γ = (1, 2, 3)` and the centered `u = (1, -1, 0)`: the paper's rule that LayerNorm with a
learned scale commutes with `SO(d_e − 1)` fails (claim `ln-affine-rotation`, refutes). -/
theorem ln_gamma_does_not_commute_with_rotation :
    Vec3.cycle Vec3.ones = Vec3.ones ∧
      Vec3.hadamard gammaSample (Vec3.cycle centeredSample) ≠
        Vec3.cycle (Vec3.hadamard gammaSample centeredSample) :=
  ⟨rfl, Vec3.ne_of_y_ne (by decide)⟩

section General

variable {Mat : Nat → Nat → Type} [MatrixAlgebra Mat]

/-- The corrected reader rule: if the stream carries `g·z` instead of `z` (`g'·g = 1`), a
reader `W` of the LayerNorm output `D·z + β` (`D = diag γ`) is replaced by `W·D·g'` on the
stream plus the constant `W·β`, and reads exactly the same values:
`(W·D·g')·(g·z) + W·β = W·(D·z + β)` (claim `ln-affine-rotation`, corrects). -/
theorem ln_reader_absorbs_affine {d k : Nat} (W : Mat k d) (D : Mat d d) (β z : Mat d 1)
    (g g' : Mat d d) (hg : g' ⬝ g = one d) :
    W ⬝ D ⬝ g' ⬝ (g ⬝ z) ⊞ W ⬝ β = W ⬝ (D ⬝ z ⊞ β) := by
  rw [MatrixAlgebra.mul_add W (D ⬝ z) β, MatrixAlgebra.mul_assoc (W ⬝ D) g' (g ⬝ z),
    ← MatrixAlgebra.mul_assoc g' g z, hg, MatrixAlgebra.one_mul z,
    MatrixAlgebra.mul_assoc W D z]

end General

end GaugeAudit
