/-!
# Commutative rings, given by their laws

`CommRingLaws R` packages the operations of a commutative ring with the standard axioms as
explicit fields, so that statements "over a commutative ring" (the RoPE commutant) hold for
every model: `Int`, the rationals, the reals, the complex numbers, polynomial rings, ...
The handful of consequences needed later (`a * 𝟎 = 𝟎`, `(-𝟏) * a = -a`, ...) are derived
here from the fields alone.
-/

namespace GaugeAudit

/-- A commutative ring: `+`, `*`, `-`, `𝟎`, `𝟏` and the standard laws. -/
class CommRingLaws (R : Type) extends Add R, Mul R, Neg R where
  /-- The additive identity `𝟎`. -/
  zero : R
  /-- The multiplicative identity `𝟏`. -/
  one : R
  add_assoc : ∀ a b c : R, a + b + c = a + (b + c)
  add_comm : ∀ a b : R, a + b = b + a
  zero_add : ∀ a : R, zero + a = a
  add_zero : ∀ a : R, a + zero = a
  neg_add_cancel : ∀ a : R, -a + a = zero
  mul_assoc : ∀ a b c : R, a * b * c = a * (b * c)
  mul_comm : ∀ a b : R, a * b = b * a
  one_mul : ∀ a : R, one * a = a
  mul_one : ∀ a : R, a * one = a
  left_distrib : ∀ a b c : R, a * (b + c) = a * b + a * c
  right_distrib : ∀ a b c : R, (a + b) * c = a * c + b * c

/-- `𝟎`, the zero of a `CommRingLaws` ring. -/
notation "𝟎" => CommRingLaws.zero
/-- `𝟏`, the one of a `CommRingLaws` ring. -/
notation "𝟏" => CommRingLaws.one

namespace CommRingLaws

variable {R : Type} [CommRingLaws R]

/-- `a + -a = 𝟎`. -/
theorem add_neg_cancel (a : R) : a + -a = 𝟎 :=
  (CommRingLaws.add_comm a (-a)).trans (CommRingLaws.neg_add_cancel a)

/-- `a * 𝟎 = 𝟎`, from distributivity and additive inverses. -/
theorem mul_zero (a : R) : a * 𝟎 = 𝟎 := by
  have h : a * 𝟎 = a * 𝟎 + a * 𝟎 :=
    calc a * 𝟎 = a * (𝟎 + 𝟎) := by rw [CommRingLaws.zero_add (𝟎 : R)]
      _ = a * 𝟎 + a * 𝟎 := CommRingLaws.left_distrib a 𝟎 𝟎
  calc a * 𝟎 = 𝟎 + a * 𝟎 := (CommRingLaws.zero_add (a * 𝟎)).symm
    _ = -(a * 𝟎) + a * 𝟎 + a * 𝟎 := by rw [CommRingLaws.neg_add_cancel (a * 𝟎)]
    _ = -(a * 𝟎) + (a * 𝟎 + a * 𝟎) := CommRingLaws.add_assoc (-(a * 𝟎)) (a * 𝟎) (a * 𝟎)
    _ = -(a * 𝟎) + a * 𝟎 := by rw [← h]
    _ = 𝟎 := CommRingLaws.neg_add_cancel (a * 𝟎)

/-- `𝟎 * a = 𝟎`. -/
theorem zero_mul (a : R) : 𝟎 * a = 𝟎 :=
  (CommRingLaws.mul_comm (𝟎 : R) a).trans (CommRingLaws.mul_zero a)

/-- Additive inverses are unique: `x + a = 𝟎` forces `x = -a`. -/
theorem neg_eq_of_add_eq_zero {x a : R} (h : x + a = 𝟎) : x = -a :=
  calc x = x + 𝟎 := (CommRingLaws.add_zero x).symm
    _ = x + (a + -a) := by rw [CommRingLaws.add_neg_cancel a]
    _ = x + a + -a := (CommRingLaws.add_assoc x a (-a)).symm
    _ = 𝟎 + -a := by rw [h]
    _ = -a := CommRingLaws.zero_add (-a)

/-- `(-𝟏) * a = -a`. -/
theorem neg_one_mul (a : R) : (-𝟏) * a = -a := by
  apply CommRingLaws.neg_eq_of_add_eq_zero
  calc (-𝟏) * a + a = (-𝟏) * a + 𝟏 * a := by rw [CommRingLaws.one_mul a]
    _ = ((-𝟏) + 𝟏) * a := (CommRingLaws.right_distrib (-𝟏 : R) 𝟏 a).symm
    _ = 𝟎 * a := by rw [CommRingLaws.neg_add_cancel (𝟏 : R)]
    _ = 𝟎 := CommRingLaws.zero_mul a

/-- `a * (-𝟏) = -a`. -/
theorem mul_neg_one (a : R) : a * (-𝟏) = -a :=
  (CommRingLaws.mul_comm a (-𝟏)).trans (CommRingLaws.neg_one_mul a)

end CommRingLaws

end GaugeAudit
