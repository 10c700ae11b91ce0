import Lake
open Lake DSL

-- The formal layer of gauge-audit: core Lean 4 only (no Mathlib, no Batteries), so
-- `lake build` needs nothing but the toolchain pinned in `lean-toolchain`.

package «gauge-audit» where
  leanOptions := #[
    ⟨`autoImplicit, false⟩, -- prevents typos to be interpreted as new free variables
    ⟨`relaxedAutoImplicit, false⟩
  ]

-- Library `GaugeAudit`: sources under `lean/`, root module `lean/GaugeAudit.lean`.
@[default_target]
lean_lib GaugeAudit where
  srcDir := "lean"
