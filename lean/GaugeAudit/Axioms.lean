import GaugeAudit.Attention
import GaugeAudit.Value
import GaugeAudit.Heads
import GaugeAudit.LayerNorm
import GaugeAudit.Activation
import GaugeAudit.RoPE
import GaugeAudit.GQA
import GaugeAudit.Counts
import GaugeAudit.Tables

/-!
# Axiom audit

`#print axioms` for every main theorem, each under `#guard_msgs`: `lake build` fails if the
printed dependencies change.  Every proof in this library is axiom-free (rewriting with the
laws of the abstract structures, structural induction, and kernel evaluation of small integer
computations by `rfl`/`decide`), so each check expects
`'NAME' does not depend on any axioms`.  A proof that started to use anything, even one of
the standard axioms `propext`, `Classical.choice`, `Quot.sound`, or `sorryAx`, a new `axiom`
or a `native_decide` axiom, breaks the build here.

`tests/test_lean.py` checks that every theorem naming a claim is listed in this file.
-/

/-- info: 'GaugeAudit.relu_nonneg_homogeneous' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.relu_nonneg_homogeneous

/-- info: 'GaugeAudit.relu_commutes_with_nonneg_diagonal' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.relu_commutes_with_nonneg_diagonal

/-- info: 'GaugeAudit.qk_scores_invariant' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.qk_scores_invariant

/-- info: 'GaugeAudit.qk_same_action_invariant_of_orthogonal' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.qk_same_action_invariant_of_orthogonal

/-- info: 'GaugeAudit.qk_same_action_requires_orthogonal' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.qk_same_action_requires_orthogonal

/-- info: 'GaugeAudit.nierop_eq14_corrected' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.nierop_eq14_corrected

/-- info: 'GaugeAudit.qk_same_action_changes_scores_diag' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.qk_same_action_changes_scores_diag

/-- info: 'GaugeAudit.qk_nonorthogonal_shear_preserves_scores' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.qk_nonorthogonal_shear_preserves_scores

/-- info: 'GaugeAudit.nierop_eq14_transposed_placement_fails' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.nierop_eq14_transposed_placement_fails

/-- info: 'GaugeAudit.count_transformer_base' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.count_transformer_base

/-- info: 'GaugeAudit.count_transformer_base_per_layer' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.count_transformer_base_per_layer

/-- info: 'GaugeAudit.count_nierop_gpt2_small' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.count_nierop_gpt2_small

/-- info: 'GaugeAudit.count_nierop_gpt2_xl' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.count_nierop_gpt2_xl

/-- info: 'GaugeAudit.count_nierop_table1_percentages' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.count_nierop_table1_percentages

/-- info: 'GaugeAudit.count_wiki_log_hfact_refuted' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.count_wiki_log_hfact_refuted

/-- info: 'GaugeAudit.gqa_tied_query_gauges' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.gqa_tied_query_gauges

/-- info: 'GaugeAudit.gqa_tied_gauge_preserves_scores' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.gqa_tied_gauge_preserves_scores

/-- info: 'GaugeAudit.headSum_perm' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.headSum_perm

/-- info: 'GaugeAudit.multiHead_perm' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.multiHead_perm

/-- info: 'GaugeAudit.ln_gamma_does_not_commute_with_rotation' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.ln_gamma_does_not_commute_with_rotation

/-- info: 'GaugeAudit.ln_reader_absorbs_affine' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.ln_reader_absorbs_affine

/-- info: 'GaugeAudit.rope_commutant_iff' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.rope_commutant_iff

/-- info: 'GaugeAudit.diag_not_in_rope_commutant' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.diag_not_in_rope_commutant

/-- info: 'GaugeAudit.vo_output_invariant' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.vo_output_invariant

/-- info: 'GaugeAudit.vo_attention_output_invariant_with_bias' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.vo_attention_output_invariant_with_bias

/-- info: 'GaugeAudit.value_gauge_requires_inverse' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.value_gauge_requires_inverse

/-- info: 'GaugeAudit.value_gauge_eq_inverse' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.value_gauge_eq_inverse

/-- info: 'GaugeAudit.value_gauge_invariant_of_inverse' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.value_gauge_invariant_of_inverse

/-- info: 'GaugeAudit.value_g3_eq_g0_fails_quarter_turn' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.value_g3_eq_g0_fails_quarter_turn

/-- info: 'GaugeAudit.value_g3_inverse_quarter_turn' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.value_g3_inverse_quarter_turn

/-- info: 'GaugeAudit.qk_scores_invariant_forces_mul_tr_eq_one' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.qk_scores_invariant_forces_mul_tr_eq_one

/-- info: 'GaugeAudit.relu_not_homogeneous_for_negative' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.relu_not_homogeneous_for_negative

/-- info: 'GaugeAudit.MatrixAlgebra.eq_inv_tr_of_mul_tr_eq_one' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.MatrixAlgebra.eq_inv_tr_of_mul_tr_eq_one

/-- info: 'GaugeAudit.MatrixAlgebra.eq_of_mul_eq_one' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.MatrixAlgebra.eq_of_mul_eq_one

/-- info: 'GaugeAudit.MatrixAlgebra.add_left_comm' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.MatrixAlgebra.add_left_comm

/-- info: 'GaugeAudit.CommRingLaws.mul_zero' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.CommRingLaws.mul_zero

/-- info: 'GaugeAudit.CommRingLaws.neg_one_mul' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.CommRingLaws.neg_one_mul

/-- info: 'GaugeAudit.mul_quarterTurn' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.mul_quarterTurn

/-- info: 'GaugeAudit.quarterTurn_mul' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.quarterTurn_mul

/-- info: 'GaugeAudit.wreath_order_mqa' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wreath_order_mqa

/-- info: 'GaugeAudit.wreath_order_mha' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wreath_order_mha

/-- info: 'GaugeAudit.head_perm_order_small' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.head_perm_order_small

/-- info: 'GaugeAudit.gqa_discrete_group_order_refuted' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.gqa_discrete_group_order_refuted

/-- info: 'GaugeAudit.wiki_gqa_wreath_orders' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wiki_gqa_wreath_orders

/-- info: 'GaugeAudit.hg_savings_examples' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.hg_savings_examples

/-- info: 'GaugeAudit.pith_so_stabilizer_dim_values' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.pith_so_stabilizer_dim_values

/-- info: 'GaugeAudit.wiki_gpt2_110m_refuted' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wiki_gpt2_110m_refuted

/-- info: 'GaugeAudit.wiki_gpt2_redundancy_table_refuted' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wiki_gpt2_redundancy_table_refuted

/-- info: 'GaugeAudit.wiki_gqa_dim_table_refuted' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wiki_gqa_dim_table_refuted

/-- info: 'GaugeAudit.wiki_gqa_percent_table_refuted' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wiki_gqa_percent_table_refuted

/-- info: 'GaugeAudit.wiki_eps_mach_value' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.wiki_eps_mach_value

/-- info: 'GaugeAudit.nierop_table1_arithmetic' does not depend on any axioms -/
#guard_msgs in
#print axioms GaugeAudit.nierop_table1_arithmetic
