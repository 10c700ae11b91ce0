import GaugeAudit.MatrixAlgebra
import GaugeAudit.Concrete

/-!
# Value–output gauge freedom, and van Nierop's value condition

* `vo_output_invariant`, `vo_attention_output_invariant_with_bias`: `W_V ↦ W_V·N`,
  `b_V ↦ b_V·N`, `W_O ↦ N⁻¹·W_O` leaves a head's output unchanged for every invertible `N`
  (the `GL(d_v)` symmetry), for any attention weights.
* van Nierop (Sec. 4.4) transforms `V ↦ h·V·g(3)` and `Ē ↦ g(0)·Ē` and concludes
  `g(3) = g(0)`.  Invariance of `V·Ē` for every `Ē` forces instead `g(3)·g(0) = 1`, i.e.
  `g(3) = g(0)⁻¹` (`value_gauge_requires_inverse`, `value_gauge_eq_inverse`); the paper's
  rule fails for the quarter-turn rotation (`value_g3_eq_g0_fails_quarter_turn`).
-/

namespace GaugeAudit

open MatrixAlgebra (one)

section General

variable {Mat : Nat → Nat → Type} [MatrixAlgebra Mat]

/-- The value–output product is unchanged by `W_V ↦ W_V·N`, `W_O ↦ N⁻¹·W_O` for every
invertible `N` (here `N' = N⁻¹`): `(X·W_V·N)·(N⁻¹·W_O) = X·W_V·W_O` (claim `vo-gl`). -/
theorem vo_output_invariant {n d dv dout : Nat} (X : Mat n d) (W_V : Mat d dv)
    (W_O : Mat dv dout) (N N' : Mat dv dv) (hN : N ⬝ N' = one dv) :
    (X ⬝ W_V ⬝ N) ⬝ (N' ⬝ W_O) = X ⬝ W_V ⬝ W_O := by
  rw [MatrixAlgebra.mul_assoc (X ⬝ W_V) N, ← MatrixAlgebra.mul_assoc N N', hN,
    MatrixAlgebra.one_mul W_O]

/-- With attention weights `P` (any `n × n` matrix, e.g. a softmax of the scores) and a value
bias `b_V` broadcast over the rows by the all-ones column `ones`, the head output
`P·(X·W_V + 1·b_V)·W_O` is unchanged by `W_V ↦ W_V·N`, `b_V ↦ b_V·N`, `W_O ↦ N⁻¹·W_O`
(claim `vo-gl`). -/
theorem vo_attention_output_invariant_with_bias {n d dv dout : Nat} (P : Mat n n)
    (X : Mat n d) (W_V : Mat d dv) (ones : Mat n 1) (b_V : Mat 1 dv) (W_O : Mat dv dout)
    (N N' : Mat dv dv) (hN : N ⬝ N' = one dv) :
    P ⬝ (X ⬝ W_V ⬝ N ⊞ ones ⬝ (b_V ⬝ N)) ⬝ (N' ⬝ W_O) = P ⬝ (X ⬝ W_V ⊞ ones ⬝ b_V) ⬝ W_O := by
  rw [← MatrixAlgebra.mul_assoc ones b_V N, ← MatrixAlgebra.add_mul (X ⬝ W_V) (ones ⬝ b_V) N,
    ← MatrixAlgebra.mul_assoc P (X ⬝ W_V ⊞ ones ⬝ b_V) N,
    MatrixAlgebra.mul_assoc (P ⬝ (X ⬝ W_V ⊞ ones ⬝ b_V)) N, ← MatrixAlgebra.mul_assoc N N', hN,
    MatrixAlgebra.one_mul W_O]

/-- If `V ↦ V·g(3)` together with `Ē ↦ g(0)·Ē` leaves `V·Ē` unchanged for every `Ē`, and
`V` separates matrices (`hcancel`: `V·P·Ē = V·Q·Ē` for all `Ē` implies `P = Q`; it holds when
`V` has full column rank), then `g(3)·g(0) = 1` (claim `value-g3-eq-g0`, refutes).  A common left
factor `h(3)` on `V` cancels from both sides and is omitted. -/
theorem value_gauge_requires_inverse {n de dh : Nat} (V : Mat dh de) (g0 g3 : Mat de de)
    (hcancel : ∀ P Q : Mat de de, (∀ Ebar : Mat de n, V ⬝ P ⬝ Ebar = V ⬝ Q ⬝ Ebar) → P = Q)
    (hinv : ∀ Ebar : Mat de n, V ⬝ g3 ⬝ (g0 ⬝ Ebar) = V ⬝ Ebar) :
    g3 ⬝ g0 = one de := by
  apply hcancel
  intro Ebar
  rw [MatrixAlgebra.mul_one V, ← MatrixAlgebra.mul_assoc V g3 g0,
    MatrixAlgebra.mul_assoc (V ⬝ g3) g0 Ebar]
  exact hinv Ebar

/-- Hence `g(3) = g(0)⁻¹` (here `g0'` with `g(0)·g0' = 1`), not `g(3) = g(0)` as the paper
states (claim `value-g3-eq-g0`, refutes). -/
theorem value_gauge_eq_inverse {n de dh : Nat} (V : Mat dh de) (g0 g0' g3 : Mat de de)
    (hg0 : g0 ⬝ g0' = one de)
    (hcancel : ∀ P Q : Mat de de, (∀ Ebar : Mat de n, V ⬝ P ⬝ Ebar = V ⬝ Q ⬝ Ebar) → P = Q)
    (hinv : ∀ Ebar : Mat de n, V ⬝ g3 ⬝ (g0 ⬝ Ebar) = V ⬝ Ebar) :
    g3 = g0' :=
  MatrixAlgebra.eq_of_mul_eq_one (value_gauge_requires_inverse V g0 g3 hcancel hinv) hg0

/-- Conversely `g(3)·g(0) = 1` does preserve `V·Ē` (claim `value-g3-eq-g0`, context). -/
theorem value_gauge_invariant_of_inverse {n de dh : Nat} (V : Mat dh de) (g0 g3 : Mat de de)
    (h : g3 ⬝ g0 = one de) (Ebar : Mat de n) :
    V ⬝ g3 ⬝ (g0 ⬝ Ebar) = V ⬝ Ebar := by
  rw [← MatrixAlgebra.mul_assoc (V ⬝ g3) g0 Ebar, MatrixAlgebra.mul_assoc V g3 g0, h,
    MatrixAlgebra.mul_one V]

end General

section Concrete

/-- The paper's rule `g(3) = g(0)` fails for the quarter-turn rotation `J`: with
`g(3) = g(0) = J`, `V·J·(J·Ē) = -V·Ē ≠ V·Ē` for the sample `V` and `Ē = 1`
(claim `value-g3-eq-g0`, refutes). -/
theorem value_g3_eq_g0_fails_quarter_turn :
    Mat2.mul (Mat2.mul sampleQ quarterTurnInt) (Mat2.mul quarterTurnInt id2) ≠
      Mat2.mul sampleQ id2 :=
  Mat2.ne_of_a_ne (by decide)

/-- The corrected rule `g(3) = g(0)⁻¹ = Jᵀ` works on the same example
(claim `value-g3-eq-g0`, context). -/
theorem value_g3_inverse_quarter_turn :
    Mat2.mul (Mat2.mul sampleQ (Mat2.tr quarterTurnInt)) (Mat2.mul quarterTurnInt id2) =
      Mat2.mul sampleQ id2 :=
  rfl

end Concrete

end GaugeAudit
