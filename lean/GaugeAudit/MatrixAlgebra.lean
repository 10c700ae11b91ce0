/-!
# An abstract, dimension-indexed matrix algebra

The general gauge theorems of this library are stated for *any* family of matrix types
`Mat m n` (`m` rows, `n` columns) that has a product, identities, a transpose, a sum and
zero matrices obeying the usual laws.  Real, rational and complex matrices are models, so
every theorem proved here holds for each of them; no particular number system is assumed.

An invertible square matrix is written as a pair `M`, `M'` with `M ⬝ M' = one d` (and,
where needed, `M' ⬝ M = one d`); `M'ᵀ` is then the inverse transpose `M⁻ᵀ`.

Notation: `A ⬝ B` is the product, `Aᵀ` the transpose, `A ⊞ B` the sum.
-/

namespace GaugeAudit

/-- A dimension-indexed matrix algebra: the operations and the laws the gauge arguments use. -/
class MatrixAlgebra (Mat : Nat → Nat → Type) where
  /-- The matrix product of an `m × n` and an `n × p` matrix. -/
  mul : {m n p : Nat} → Mat m n → Mat n p → Mat m p
  /-- The `n × n` identity matrix. -/
  one : (n : Nat) → Mat n n
  /-- The transpose. -/
  tr : {m n : Nat} → Mat m n → Mat n m
  /-- The entrywise sum. -/
  add : {m n : Nat} → Mat m n → Mat m n → Mat m n
  /-- The `m × n` zero matrix. -/
  zero : (m n : Nat) → Mat m n
  mul_assoc : ∀ {m n p q : Nat} (A : Mat m n) (B : Mat n p) (C : Mat p q),
    mul (mul A B) C = mul A (mul B C)
  one_mul : ∀ {m n : Nat} (A : Mat m n), mul (one m) A = A
  mul_one : ∀ {m n : Nat} (A : Mat m n), mul A (one n) = A
  tr_mul : ∀ {m n p : Nat} (A : Mat m n) (B : Mat n p), tr (mul A B) = mul (tr B) (tr A)
  tr_tr : ∀ {m n : Nat} (A : Mat m n), tr (tr A) = A
  tr_one : ∀ (n : Nat), tr (one n) = one n
  add_assoc : ∀ {m n : Nat} (A B C : Mat m n), add (add A B) C = add A (add B C)
  add_comm : ∀ {m n : Nat} (A B : Mat m n), add A B = add B A
  mul_add : ∀ {m n p : Nat} (A : Mat m n) (B C : Mat n p),
    mul A (add B C) = add (mul A B) (mul A C)
  add_mul : ∀ {m n p : Nat} (A B : Mat m n) (C : Mat n p),
    mul (add A B) C = add (mul A C) (mul B C)

/-- `A ⬝ B`: the matrix product `MatrixAlgebra.mul A B`. -/
infixl:70 " ⬝ " => MatrixAlgebra.mul
/-- `A ⊞ B`: the matrix sum `MatrixAlgebra.add A B`. -/
infixl:65 " ⊞ " => MatrixAlgebra.add
/-- `Aᵀ`: the transpose `MatrixAlgebra.tr A`. -/
postfix:max "ᵀ" => MatrixAlgebra.tr

open MatrixAlgebra (one)

section Laws

variable {Mat : Nat → Nat → Type} [MatrixAlgebra Mat]

/-- Sums may be reordered: `A ⊞ (B ⊞ C) = B ⊞ (A ⊞ C)`. -/
theorem MatrixAlgebra.add_left_comm {m n : Nat} (A B C : Mat m n) :
    A ⊞ (B ⊞ C) = B ⊞ (A ⊞ C) :=
  calc A ⊞ (B ⊞ C) = A ⊞ B ⊞ C := (MatrixAlgebra.add_assoc A B C).symm
    _ = B ⊞ A ⊞ C := congrArg (fun (S : Mat m n) => S ⊞ C) (MatrixAlgebra.add_comm A B)
    _ = B ⊞ (A ⊞ C) := MatrixAlgebra.add_assoc B A C

/-- A right inverse of `Nᵀ` is the inverse transpose: if `M ⬝ Nᵀ = 1` and `N' ⬝ N = 1`
then `M = N'ᵀ`. -/
theorem MatrixAlgebra.eq_inv_tr_of_mul_tr_eq_one {d : Nat} {M N N' : Mat d d}
    (h : M ⬝ Nᵀ = one d) (hN : N' ⬝ N = one d) : M = N'ᵀ :=
  calc M = M ⬝ one d := (MatrixAlgebra.mul_one M).symm
    _ = M ⬝ (Nᵀ ⬝ N'ᵀ) := by
        rw [← MatrixAlgebra.tr_mul N' N, hN, MatrixAlgebra.tr_one d]
    _ = M ⬝ Nᵀ ⬝ N'ᵀ := (MatrixAlgebra.mul_assoc M Nᵀ N'ᵀ).symm
    _ = one d ⬝ N'ᵀ := by rw [h]
    _ = N'ᵀ := MatrixAlgebra.one_mul N'ᵀ

/-- A left inverse is the inverse: if `G ⬝ g = 1` and `g ⬝ g' = 1` then `G = g'`. -/
theorem MatrixAlgebra.eq_of_mul_eq_one {d : Nat} {G g g' : Mat d d}
    (h : G ⬝ g = one d) (hg : g ⬝ g' = one d) : G = g' :=
  calc G = G ⬝ one d := (MatrixAlgebra.mul_one G).symm
    _ = G ⬝ (g ⬝ g') := by rw [hg]
    _ = G ⬝ g ⬝ g' := (MatrixAlgebra.mul_assoc G g g').symm
    _ = one d ⬝ g' := by rw [h]
    _ = g' := MatrixAlgebra.one_mul g'

end Laws

end GaugeAudit
