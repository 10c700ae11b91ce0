import GaugeAudit.Ring
import GaugeAudit.Concrete

/-!
# The RoPE commutant

Rotary position embeddings rotate each 2-dimensional query/key block by a position-dependent
angle, i.e. by polynomials in the quarter turn `J = [[0, -1], [1, 0]]`.  A block gauge
`M` survives RoPE exactly when it commutes with `J`; over any commutative ring these are the
matrices `[[a, -b], [b, a]]` (multiplication by the complex number `a + b·i`), which is why
the RoPE gauge group is `(GL(1, ℂ))^(d_k/2)` per head rather than `GL(d_k)`.
-/

namespace GaugeAudit

section Ring

variable {R : Type} [CommRingLaws R]

/-- The quarter-turn `J = [[0, -1], [1, 0]]` over a commutative ring. -/
def quarterTurn : Mat2 R := ⟨𝟎, -𝟏, 𝟏, 𝟎⟩

/-- `A·J = [[b, -a], [d, -c]]` for `A = [[a, b], [c, d]]`. -/
theorem mul_quarterTurn (A : Mat2 R) : Mat2.mul A quarterTurn = ⟨A.b, -A.a, A.d, -A.c⟩ := by
  show (⟨A.a * 𝟎 + A.b * 𝟏, A.a * (-𝟏) + A.b * 𝟎,
      A.c * 𝟎 + A.d * 𝟏, A.c * (-𝟏) + A.d * 𝟎⟩ : Mat2 R) = ⟨A.b, -A.a, A.d, -A.c⟩
  rw [CommRingLaws.mul_zero A.a, CommRingLaws.mul_one A.b, CommRingLaws.mul_neg_one A.a,
    CommRingLaws.mul_zero A.b, CommRingLaws.mul_zero A.c, CommRingLaws.mul_one A.d,
    CommRingLaws.mul_neg_one A.c, CommRingLaws.mul_zero A.d, CommRingLaws.zero_add A.b,
    CommRingLaws.add_zero (-A.a), CommRingLaws.zero_add A.d, CommRingLaws.add_zero (-A.c)]

/-- `J·A = [[-c, -d], [a, b]]` for `A = [[a, b], [c, d]]`. -/
theorem quarterTurn_mul (A : Mat2 R) : Mat2.mul quarterTurn A = ⟨-A.c, -A.d, A.a, A.b⟩ := by
  show (⟨𝟎 * A.a + (-𝟏) * A.c, 𝟎 * A.b + (-𝟏) * A.d,
      𝟏 * A.a + 𝟎 * A.c, 𝟏 * A.b + 𝟎 * A.d⟩ : Mat2 R) = ⟨-A.c, -A.d, A.a, A.b⟩
  rw [CommRingLaws.zero_mul A.a, CommRingLaws.neg_one_mul A.c, CommRingLaws.zero_mul A.b,
    CommRingLaws.neg_one_mul A.d, CommRingLaws.one_mul A.a, CommRingLaws.zero_mul A.c,
    CommRingLaws.one_mul A.b, CommRingLaws.zero_mul A.d, CommRingLaws.zero_add (-A.c),
    CommRingLaws.zero_add (-A.d), CommRingLaws.add_zero A.a, CommRingLaws.add_zero A.b]

/-- A `2 × 2` matrix over a commutative ring commutes with the quarter turn `J` if and only if
it has the form `[[a, -b], [b, a]]` (claim `rope-commutant`). -/
theorem rope_commutant_iff (A : Mat2 R) :
    Mat2.mul A quarterTurn = Mat2.mul quarterTurn A ↔ ∃ a b : R, A = ⟨a, -b, b, a⟩ := by
  constructor
  · intro h
    have h' : (⟨A.b, -A.a, A.d, -A.c⟩ : Mat2 R) = ⟨-A.c, -A.d, A.a, A.b⟩ :=
      (mul_quarterTurn A).symm.trans (h.trans (quarterTurn_mul A))
    have hb : A.b = -A.c := congrArg Mat2.a h'
    have hd : A.d = A.a := congrArg Mat2.c h'
    refine ⟨A.a, A.c, ?_⟩
    calc A = (⟨A.a, A.b, A.c, A.d⟩ : Mat2 R) := rfl
      _ = ⟨A.a, -A.c, A.c, A.a⟩ := by rw [hb, hd]
  · intro h
    obtain ⟨a, b, hA⟩ := h
    subst hA
    exact (mul_quarterTurn (⟨a, -b, b, a⟩ : Mat2 R)).trans
      (quarterTurn_mul (⟨a, -b, b, a⟩ : Mat2 R)).symm

end Ring

/-- A matrix outside the commutant: `diag(2, 1)` does not commute with `J` over `Int`, so a
general `GL(2)` gauge does not survive RoPE (claim `rope-commutant`). -/
theorem diag_not_in_rope_commutant :
    Mat2.mul diag21 quarterTurnInt ≠ Mat2.mul quarterTurnInt diag21 :=
  Mat2.ne_of_b_ne (by decide)

end GaugeAudit
