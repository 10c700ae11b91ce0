/-!
# ReLU is positively homogeneous

van Nierop states that "the nonlinearity in the feed-forward network forces
`f(0) = f(1) = 1`".  It does not: `relu (c·x) = c·relu x` for every `c ≥ 0`, so scaling a
hidden neuron's incoming weights (and bias) by `c > 0` and its outgoing weights by `1/c`
leaves the network unchanged.  The identity is proved over `Int` (a nonnegative integer is
a natural number `c`); the same case analysis works over any ordered field.
-/

namespace GaugeAudit

/-- `relu x = max x 0` on the integers. -/
def relu : Int → Int
  | Int.ofNat n => Int.ofNat n
  | Int.negSucc _ => 0

/-- `relu` vanishes on `-k` for every natural number `k`. -/
theorem relu_negOfNat : (k : Nat) → relu (Int.negOfNat k) = 0
  | 0 => rfl
  | _ + 1 => rfl

/-- ReLU is positively homogeneous: `relu (c·x) = c·relu x` for every `c ≥ 0`, so positive
per-neuron scaling is a symmetry of the feed-forward block and `f(0) = f(1) = 1` is not forced
(claim `relu-forces-identity`, refutes). -/
theorem relu_nonneg_homogeneous (c : Nat) : ∀ x : Int, relu ((c : Int) * x) = (c : Int) * relu x
  | Int.ofNat _ => rfl
  | Int.negSucc m =>
    have h : relu ((c : Int) * Int.negSucc m) = 0 := relu_negOfNat (c * Nat.succ m)
    h.trans rfl

/-- A nonnegative diagonal scaling `s` of the hidden pre-activations commutes with ReLU,
coordinate by coordinate: `relu (s_i·z_i) = s_i·relu z_i` (claim `relu-forces-identity`, refutes). -/
theorem relu_commutes_with_nonneg_diagonal {k : Nat} (s : Fin k → Nat) (z : Fin k → Int)
    (i : Fin k) : relu ((s i : Int) * z i) = (s i : Int) * relu (z i) :=
  relu_nonneg_homogeneous (s i) (z i)

/-- Homogeneity needs `c ≥ 0`: for `c = -1`, `relu (-1·1) = 0 ≠ -1 = -1·relu 1`; the
symmetry is the positive scalings only. -/
theorem relu_not_homogeneous_for_negative : relu ((-1) * 1) ≠ (-1) * relu 1 := by
  decide

end GaugeAudit
