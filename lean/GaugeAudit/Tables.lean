import GaugeAudit.Counts

/-!
# Group orders and table arithmetic

The orders of the discrete head-permutation groups and the cells of the sources' tables as `Nat`
computations, checked by `decide` (kernel evaluation of small literals), plus the two general
order formulas of the wreath product at its ends, proved by structural recursion.

* GQA/MQA with `n_kv` key/value heads of `g` query heads each: the function-preserving head
  permutations form `S_g ≀ S_{n_kv} = (S_g)^{n_kv} ⋊ S_{n_kv}`, of order `(g!)^{n_kv}·n_kv!`
  (enumerated in `gauge_audit.experiments.discrete`).  With one group it is `S_h` (MQA), with
  groups of one it is `S_h` again (MHA).
-/

namespace GaugeAudit

/-- `|(S_g)^n ⋊ S_n| = (g!)^n · n!`: `n` blocks of `g` query heads. -/
def wreathOrder (g n : Nat) : Nat := factorial g ^ n * factorial n

/-- `0 + n = n`, by recursion on `n` (no library lemma, so no axiom). -/
theorem zero_add_self : ∀ n : Nat, 0 + n = n
  | 0 => rfl
  | n + 1 => congrArg Nat.succ (zero_add_self n)

/-- `n · 1 = n`: `n · 1` unfolds to `0 + n`. -/
theorem mul_one_self (n : Nat) : n * 1 = n := zero_add_self n

/-- `1 · n = n`, by recursion on `n`. -/
theorem one_mul_self : ∀ n : Nat, 1 * n = n
  | 0 => rfl
  | n + 1 => congrArg Nat.succ (one_mul_self n)

/-- `1 ^ n = 1`, by recursion on `n`. -/
theorem one_pow_self : ∀ n : Nat, 1 ^ n = 1
  | 0 => rfl
  | n + 1 => (mul_one_self (1 ^ n)).trans (one_pow_self n)

/-- Multi-query attention (one key/value head, `g = h` query heads): the wreath product is all of
`S_h`, of order `h!`, for every `h` (claim `wiki-gqa-chain`, context). -/
theorem wreath_order_mqa (g : Nat) : wreathOrder g 1 = factorial g :=
  calc wreathOrder g 1 = (1 * factorial g) * 1 := rfl
    _ = 1 * factorial g := mul_one_self _
    _ = factorial g := one_mul_self _

/-- Multi-head attention (groups of one query head, `n = h` key/value heads): the wreath product is
`S_h`, of order `h!`, for every `h` (claim `head-perm-order`). -/
theorem wreath_order_mha (n : Nat) : wreathOrder 1 n = factorial n :=
  calc wreathOrder 1 n = 1 ^ n * factorial n := rfl
    _ = 1 * factorial n := congrArg (· * factorial n) (one_pow_self n)
    _ = factorial n := one_mul_self _

/-- Multi-head attention with `h = 2, 3, 4`: `h!` preserving pairs out of the `h!·h!` candidates
(claim `head-perm-order`). -/
theorem head_perm_order_small :
    wreathOrder 1 2 = 2 ∧ wreathOrder 1 3 = 6 ∧ wreathOrder 1 4 = 24 ∧ factorial 4 * factorial 4 = 576 := by
  decide

/-- The abstract's `S_h × S_g` (`h` query heads, `g` K/V groups) has order `h!·g!`: `48` for `4:2`
and `4320` for `6:3`, while the preserving permutations number `(2!)²·2! = 8` and `(2!)³·3! = 48`
(claim `gqa-discrete-group`, refutes). -/
theorem gqa_discrete_group_order_refuted :
    factorial 4 * factorial 2 = 48 ∧ wreathOrder 2 2 = 8 ∧ factorial 4 * factorial 2 ≠ wreathOrder 2 2 ∧
      factorial 6 * factorial 3 = 4320 ∧ wreathOrder 2 3 = 48 := by
  decide

/-- The wiki's composition `(S_g)^{n_kv} ⋊ S_{n_kv}` has the enumerated orders (`6:3` → `48`,
`6:2` → `72`); its symbol `S_{n_kv} ≀ S_g`, read `(S_{n_kv})^g ⋊ S_g`, gives `(3!)²·2! = 72` for
`6:3` instead (claim `wiki-gqa-wreath`, corrects). -/
theorem wiki_gqa_wreath_orders :
    wreathOrder 2 3 = 48 ∧ wreathOrder 3 2 = 72 ∧ wreathOrder 3 2 ≠ wreathOrder 2 3 := by
  decide

/-- `h/g` savings: with `h = r·g` query heads, MHA's key/value size `h·x` is `r` times GQA's `g·x`
(for `h = 12, g = 4` and `h = 32, g = 8`, `x = 2·64`), and so is the gauge dimension
`h·(d_k² + d_v²)` against `g·(d_k² + d_v²)` (claim `hg-savings`). -/
theorem hg_savings_examples :
    12 * (2 * 64) = 3 * (4 * (2 * 64)) ∧ 32 * (2 * 128) = 4 * (8 * (2 * 128)) ∧
      gmaxDim 1 12 64 64 = 3 * gmaxDim 1 4 64 64 := by
  decide

/-- The rotations fixing the all-ones vector in `ℝ^{d_e}` form `SO(d_e − 1)`, of dimension
`(d_e − 1)(d_e − 2)/2`: `1, 3, 6, 10, 15` for `d_e = 3 … 7` (the skew matrices `A` with
`A·1 = 0`, counted in SymPy) and `293 761` for `d_e = 768` (claim `pith-so-stabilizer-dim`). -/
theorem pith_so_stabilizer_dim_values :
    soDim 2 = 1 ∧ soDim 3 = 3 ∧ soDim 4 = 6 ∧ soDim 5 = 10 ∧ soDim 6 = 15 ∧ soDim 767 = 293761 := by
  decide

/-- GPT-2 small has `12·(4·768² + 4·768 + 4·768 + 2·768·3072 + 3072 + 768) + 50257·768 + 1024·768 +
2·768 = 124 439 808` parameters, more than 5 % above 110 M (claim `wiki-gpt2-110m`, refutes). -/
theorem wiki_gpt2_110m_refuted :
    12 * (4 * 768 * 768 + 4 * 768 + 4 * 768 + (2 * 768 * 3072 + 3072 + 768)) + 50257 * 768 + 1024 * 768
        + 2 * 768 = 124439808 ∧ 110000000 * 105 < 124439808 * 100 := by
  decide

/-- GPT-2 small's redundancy cells: `L·h·d_k² = 589 824` for the (W_Q, W_K) pair and as many for
(W_V, W_O), `294 912` per matrix; the `250K` cells are more than 5 % low and the total
`1 179 648` is more than 5 % above `1.1M` (claim `wiki-gpt2-redundancy-table`, refutes). -/
theorem wiki_gpt2_redundancy_table_refuted :
    12 * 12 * 64 ^ 2 = 589824 ∧ 589824 / 2 = 294912 ∧ 250000 * 105 < 294912 * 100 ∧
      1100000 * 105 < (589824 + 589824) * 100 := by
  decide

/-- The §7.4 table with `d_k = d_v = 64`: GQA `12:4` prints `12·d_k² + 4·d_v² = 65 536` but the
tied group has `4·(d_k² + d_v²) = 32 768`; MQA `12:1` prints `53 248` against `8 192`; MHA's row
is right (claim `wiki-gqa-dim-table`, refutes). -/
theorem wiki_gqa_dim_table_refuted :
    12 * 64 ^ 2 + 12 * 64 ^ 2 = gmaxDim 1 12 64 64 ∧
      12 * 64 ^ 2 + 4 * 64 ^ 2 = 65536 ∧ gmaxDim 1 4 64 64 = 32768 ∧
      12 * 64 ^ 2 + 1 * 64 ^ 2 = 53248 ∧ gmaxDim 1 1 64 64 = 8192 := by
  decide

/-- §12.3's `75 %` and `50 %`: for `h = 12` with `4` K/V heads the dimension ratio is `8/24` (true
group) or `16/24` (the wiki's own formula), neither `75/100`; for `h = 32` with `8` K/V heads it is
`16/64` or `40/64`, neither `50/100` (cross-multiplied) (claim `wiki-gqa-percent-table`, refutes). -/
theorem wiki_gqa_percent_table_refuted :
    100 * (2 * 4) ≠ 75 * (2 * 12) ∧ 100 * (12 + 4) ≠ 75 * (2 * 12) ∧
      100 * (2 * 8) ≠ 50 * (2 * 32) ∧ 100 * (32 + 8) ≠ 50 * (2 * 32) := by
  decide

/-- `2⁻⁵² ≈ 2.2·10⁻¹⁶` to two digits: `2.15·10⁻¹⁶ ≤ 2⁻⁵² < 2.25·10⁻¹⁶`, i.e.
`215·2⁵² ≤ 10¹⁸ < 225·2⁵²` (claim `wiki-eps-mach`). -/
theorem wiki_eps_mach_value :
    2 ^ 52 = 4503599627370496 ∧ 215 * 2 ^ 52 ≤ 10 ^ 18 ∧ 10 ^ 18 < 225 * 2 ^ 52 := by
  decide

/-- Table 1 is eq. (17) over the parameter counts: GPT-2 (117 M) → 1.3 %, GPT-2-XL (1.5 B) → 0.7 %,
LLaMA-65B (65.2 B) → 0.3 %, each to one decimal (claim `nierop-table1-arithmetic`). -/
theorem nierop_table1_arithmetic :
    25 * 117000000 ≤ 2000 * nieropRedundancy 12 12 64 768 ∧
      2000 * nieropRedundancy 12 12 64 768 < 27 * 117000000 ∧
    13 * 1500000000 ≤ 2000 * nieropRedundancy 48 25 64 1600 ∧
      2000 * nieropRedundancy 48 25 64 1600 < 15 * 1500000000 ∧
    5 * 65200000000 ≤ 2000 * nieropRedundancy 80 64 128 8192 ∧
      2000 * nieropRedundancy 80 64 128 8192 < 7 * 65200000000 :=
  count_nierop_table1_percentages

end GaugeAudit
