import GaugeAudit.MatrixAlgebra

/-!
# Head permutation

Multi-head attention adds the outputs of its heads.  Permuting the heads *consistently*
(each head keeps its own `W_Q`, `W_K`, `W_V`, `W_O`) only reorders the sum, so the output is
unchanged: the `S_h` factor of the gauge group.  Permutations are core's `List.Perm`, and the
attention map `attn` (softmax of scaled scores, with or without a mask) is arbitrary.
-/

namespace GaugeAudit

/-- The parameters of one attention head. -/
structure Head (Mat : Nat → Nat → Type) (d dk dv dout : Nat) where
  /-- Query weights. -/
  W_Q : Mat d dk
  /-- Key weights. -/
  W_K : Mat d dk
  /-- Value weights. -/
  W_V : Mat d dv
  /-- Output weights. -/
  W_O : Mat dv dout

section General

variable {Mat : Nat → Nat → Type} [MatrixAlgebra Mat]

/-- The sum of a list of matrices (the empty sum is the zero matrix). -/
def headSum {m n : Nat} : List (Mat m n) → Mat m n
  | [] => MatrixAlgebra.zero m n
  | A :: rest => A ⊞ headSum rest

/-- The output of one head: `attn(X·W_Q, X·W_K)·(X·W_V)·W_O`. -/
def headOutput {n d dk dv dout : Nat} (attn : Mat n dk → Mat n dk → Mat n n) (X : Mat n d)
    (h : Head Mat d dk dv dout) : Mat n dout :=
  attn (X ⬝ h.W_Q) (X ⬝ h.W_K) ⬝ (X ⬝ h.W_V) ⬝ h.W_O

/-- Multi-head attention: the sum of the head outputs. -/
def multiHead {n d dk dv dout : Nat} (attn : Mat n dk → Mat n dk → Mat n n) (X : Mat n d)
    (heads : List (Head Mat d dk dv dout)) : Mat n dout :=
  headSum (heads.map (headOutput attn X))

/-- A sum over heads does not depend on the order of the heads (claim `head-perm`). -/
theorem headSum_perm {m n : Nat} {l₁ l₂ : List (Mat m n)} (h : List.Perm l₁ l₂) :
    headSum l₁ = headSum l₂ := by
  induction h with
  | nil => rfl
  | cons A _ ih => exact congrArg (fun (S : Mat m n) => A ⊞ S) ih
  | swap A B rest => exact MatrixAlgebra.add_left_comm B A (headSum rest)
  | trans _ _ ih₁ ih₂ => exact ih₁.trans ih₂

/-- Permuting the heads consistently leaves the multi-head output unchanged, for every
attention map and input (claim `head-perm`). -/
theorem multiHead_perm {n d dk dv dout : Nat} (attn : Mat n dk → Mat n dk → Mat n n)
    (X : Mat n d) {heads₁ heads₂ : List (Head Mat d dk dv dout)}
    (h : List.Perm heads₁ heads₂) :
    multiHead attn X heads₁ = multiHead attn X heads₂ := by
  induction h with
  | nil => rfl
  | cons hd _ ih => exact congrArg (fun (S : Mat n dout) => headOutput attn X hd ⊞ S) ih
  | swap a b rest =>
    exact MatrixAlgebra.add_left_comm (headOutput attn X b) (headOutput attn X a)
      (multiHead attn X rest)
  | trans _ _ ih₁ ih₂ => exact ih₁.trans ih₂

end General

end GaugeAudit
