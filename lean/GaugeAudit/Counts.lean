/-!
# Redundancy counts

The dimension formulas of the audited texts as `Nat` functions, with the values they state
checked by `decide` (the kernel evaluates the arithmetic).

* Maximal gauge group (Wang & Wang): per layer `(GL(d_k))^h × (GL(d_v))^h ⋊ S_h`, of dimension
  `h·(d_k² + d_v²)`; over `L` layers `L·h·(d_k² + d_v²)`.  Transformer-Base:
  `12·12·(64² + 64²) = 1 179 648`, "over 1.1 million".
* van Nierop, eq. (17): `2·n_t·n_h·d_h² + ½·(d_e − 1)(d_e − 2)`, the second term being
  `dim SO(d_e − 1)`.
* The wiki's `dim G_max = h(d_k² + d_v²) + log(h!)` is wrong: the Lie algebra of `G_max` is
  `⊕ gl(d_k) ⊕ ⊕ gl(d_v)` (one block per head and kind), the finite factor `S_h` contributes
  no block, and `log(h!) > 0` for `h ≥ 2` (for `h = 12`, `12! = 479 001 600 > 1`, so the
  extra term is `log(12!) ≈ 19.99`, not `0`).
-/

namespace GaugeAudit

/-- `dim ∏_layers (GL(d_k)^h × GL(d_v)^h) = L·h·(d_k² + d_v²)`. -/
def gmaxDim (layers heads dk dv : Nat) : Nat := layers * heads * (dk ^ 2 + dv ^ 2)

/-- van Nierop's eq. (17): `2·n_t·n_h·d_h² + ½·(d_e − 1)(d_e − 2)`. -/
def nieropRedundancy (nt nh dh de : Nat) : Nat := 2 * nt * nh * dh ^ 2 + (de - 1) * (de - 2) / 2

/-- `dim SO(k) = k(k − 1)/2`. -/
def soDim (k : Nat) : Nat := k * (k - 1) / 2

/-- `n!`. -/
def factorial : Nat → Nat
  | 0 => 1
  | n + 1 => (n + 1) * factorial n

/-- The dimension of a direct sum of Lie algebras, given the dimensions of its blocks. -/
def blockDim (blocks : List Nat) : Nat := blocks.foldr (· + ·) 0

/-- Transformer-Base (12 layers, 12 heads, `d_k = d_v = 64`): the continuous gauge group has
dimension `12·12·(64² + 64²) = 1 179 648`, over 1.1 million (claim `count-transformer-base`). -/
theorem count_transformer_base :
    gmaxDim 12 12 64 64 = 1179648 ∧ 1100000 < gmaxDim 12 12 64 64 := by
  decide

/-- One layer contributes `12·(64² + 64²) = 98 304`; the 1.18 million is the whole 12-layer
model, not a single layer (claim `count-transformer-base`). -/
theorem count_transformer_base_per_layer :
    gmaxDim 1 12 64 64 = 98304 ∧ gmaxDim 1 12 64 64 ≠ 1179648 := by
  decide

/-- van Nierop's eq. (17) for GPT-2 small (`n_t = 12`, `n_h = 12`, `d_h = 64`, `d_e = 768`)
gives `1 473 409`; its first term is the `GL(d_h)` count `gmaxDim 12 12 64 64` and its second
`dim SO(767) = 293 761` (claim `count-nierop`, context). -/
theorem count_nierop_gpt2_small :
    nieropRedundancy 12 12 64 768 = 1473409 ∧
      2 * 12 * 12 * 64 ^ 2 = gmaxDim 12 12 64 64 ∧
      (768 - 1) * (768 - 2) / 2 = soDim (768 - 1) ∧ soDim 767 = 293761 := by
  decide

/-- van Nierop's eq. (17) for GPT-2 XL (`n_t = 48`, `n_h = 25`, `d_h = 64`, `d_e = 1600`)
gives `11 108 001` (claim `count-nierop`, context). -/
theorem count_nierop_gpt2_xl : nieropRedundancy 48 25 64 1600 = 11108001 := by
  decide

/-- Table 1 of van Nierop is eq. (17) divided by the parameter count: `a/b` rounds to `p/10 %`
exactly when `(2p − 1)·b ≤ 2000·a < (2p + 1)·b`, and the counts round to 1.3 % of GPT-2's
117 M, 0.7 % of GPT-2-XL's 1.5 B and 0.3 % of LLaMA-65B's 65.2 B parameters (`n_t = 80`,
`n_h = 64`, `d_h = 128`, `d_e = 8192`): the table's arithmetic is consistent with the formula
(claim `count-nierop`, context). -/
theorem count_nierop_table1_percentages :
    25 * 117000000 ≤ 2000 * nieropRedundancy 12 12 64 768 ∧
      2000 * nieropRedundancy 12 12 64 768 < 27 * 117000000 ∧
    13 * 1500000000 ≤ 2000 * nieropRedundancy 48 25 64 1600 ∧
      2000 * nieropRedundancy 48 25 64 1600 < 15 * 1500000000 ∧
    5 * 65200000000 ≤ 2000 * nieropRedundancy 80 64 128 8192 ∧
      2000 * nieropRedundancy 80 64 128 8192 < 7 * 65200000000 := by
  decide

/-- The wiki's `h(d_k² + d_v²) + log(h!)` is not a dimension: summing the Lie-algebra blocks
of `G_max` (`h` copies of `gl(d_k)`, `h` of `gl(d_v)`, none for the finite `S_h`) gives exactly
`h(d_k² + d_v²)` (`98 304` for `h = 12`, `d_k = d_v = 64`), while `12! = 479 001 600 > 1`, so
the extra `log(12!)` is positive (claim `count-wiki-log-hfact`, refutes). -/
theorem count_wiki_log_hfact_refuted :
    blockDim (List.replicate 12 (64 ^ 2) ++ List.replicate 12 (64 ^ 2)) = gmaxDim 1 12 64 64 ∧
      factorial 12 = 479001600 ∧ 1 < factorial 12 := by
  decide

end GaugeAudit
