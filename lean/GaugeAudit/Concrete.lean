/-!
# Small concrete matrices and vectors

`Mat2 R` is a `2 × 2` matrix `[[a, b], [c, d]]` with entries in `R`; `Vec3` is a vector of
three integers.  The refutations in this library are computations on such objects over
`Int`: equalities are closed by `rfl` (the kernel evaluates the integer arithmetic) and
inequalities by `decide` on a single integer entry.
-/

namespace GaugeAudit

/-- A `2 × 2` matrix `[[a, b], [c, d]]`. -/
structure Mat2 (R : Type) where
  /-- Row 1, column 1. -/
  a : R
  /-- Row 1, column 2. -/
  b : R
  /-- Row 2, column 1. -/
  c : R
  /-- Row 2, column 2. -/
  d : R

namespace Mat2

variable {R : Type}

/-- The matrix product `X·Y`. -/
def mul [Add R] [Mul R] (X Y : Mat2 R) : Mat2 R :=
  ⟨X.a * Y.a + X.b * Y.c, X.a * Y.b + X.b * Y.d,
   X.c * Y.a + X.d * Y.c, X.c * Y.b + X.d * Y.d⟩

/-- The transpose `Xᵀ`. -/
def tr (X : Mat2 R) : Mat2 R := ⟨X.a, X.c, X.b, X.d⟩

/-- Matrices with different `(1,1)` entries differ. -/
theorem ne_of_a_ne {X Y : Mat2 R} (h : X.a ≠ Y.a) : X ≠ Y :=
  fun e => h (congrArg Mat2.a e)

/-- Matrices with different `(1,2)` entries differ. -/
theorem ne_of_b_ne {X Y : Mat2 R} (h : X.b ≠ Y.b) : X ≠ Y :=
  fun e => h (congrArg Mat2.b e)

end Mat2

/-- The integer identity matrix. -/
def id2 : Mat2 Int := ⟨1, 0, 0, 1⟩

/-- The shear `[[1, 1], [0, 1]]`: invertible over `Int`, not orthogonal. -/
def shear : Mat2 Int := ⟨1, 1, 0, 1⟩

/-- The inverse shear `[[1, -1], [0, 1]]`. -/
def shearInv : Mat2 Int := ⟨1, -1, 0, 1⟩

/-- The quarter-turn rotation `J = [[0, -1], [1, 0]]` over `Int` (orthogonal, `J² = -1`). -/
def quarterTurnInt : Mat2 Int := ⟨0, -1, 1, 0⟩

/-- The non-orthogonal diagonal matrix `diag(2, 1)`. -/
def diag21 : Mat2 Int := ⟨2, 0, 0, 1⟩

/-- A sample matrix standing for `X·W_Q` (or for `V`). -/
def sampleQ : Mat2 Int := ⟨1, 2, 3, 4⟩

/-- A sample matrix standing for `X·W_K`. -/
def sampleK : Mat2 Int := ⟨5, 6, 7, 8⟩

/-- A vector of three integers. -/
structure Vec3 where
  /-- First coordinate. -/
  x : Int
  /-- Second coordinate. -/
  y : Int
  /-- Third coordinate. -/
  z : Int

namespace Vec3

/-- The entrywise (Hadamard) product `γ ⊙ u`, i.e. `diag(γ)·u`. -/
def hadamard (γ u : Vec3) : Vec3 := ⟨γ.x * u.x, γ.y * u.y, γ.z * u.z⟩

/-- The cyclic permutation `(x, y, z) ↦ (z, x, y)`: a rotation by 120° about the all-ones
axis (a permutation matrix with determinant `+1`, hence in `SO(3)`). -/
def cycle (v : Vec3) : Vec3 := ⟨v.z, v.x, v.y⟩

/-- The all-ones vector. -/
def ones : Vec3 := ⟨1, 1, 1⟩

/-- Vectors with different second coordinates differ. -/
theorem ne_of_y_ne {u v : Vec3} (h : u.y ≠ v.y) : u ≠ v :=
  fun e => h (congrArg Vec3.y e)

end Vec3

end GaugeAudit
