import GaugeAudit.MatrixAlgebra
import GaugeAudit.Ring
import GaugeAudit.Concrete
import GaugeAudit.Attention
import GaugeAudit.Value
import GaugeAudit.Heads
import GaugeAudit.LayerNorm
import GaugeAudit.Activation
import GaugeAudit.RoPE
import GaugeAudit.GQA
import GaugeAudit.Counts
import GaugeAudit.Tables
import GaugeAudit.Axioms

/-!
# GaugeAudit

Lean 4 (core only) statements and proofs of the gauge-symmetry claims audited by
`gauge-audit`.  Each main theorem's docstring names the claim it settles as
``(claim `ID`)``; `GaugeAudit.Axioms` checks that no proof depends on any axiom.

* `MatrixAlgebra`: the abstract dimension-indexed matrix algebra the general theorems use.
* `Ring`: commutative rings by their laws.  `Concrete`: small integer matrices and vectors.
* `Attention` (`qk-gl`, `qk-orthogonal-only`, `qk-same-action`, `nierop-eq14-transpose`),
  `Value` (`vo-gl`, `value-g3-eq-g0`), `Heads` (`head-perm`), `LayerNorm`
  (`ln-affine-rotation`), `Activation` (`relu-forces-identity`), `RoPE` (`rope-commutant`),
  `GQA` (`gqa-tied`), `Counts` (`count-transformer-base`, `count-nierop`,
  `count-wiki-log-hfact`), `Tables` (group orders of the head permutations: `head-perm-order`,
  `gqa-discrete-group`, `wiki-gqa-wreath`; table cells: `wiki-gpt2-110m`, `wiki-gpt2-redundancy-table`,
  `wiki-gqa-dim-table`, `wiki-gqa-percent-table`, `nierop-table1-arithmetic`; `hg-savings`,
  `pith-so-stabilizer-dim`, `wiki-eps-mach`).
-/
