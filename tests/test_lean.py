"""Cross-checks of the Lean 4 formal layer (``lean/``, ``lakefile.lean``).

Without a Lean toolchain these tests still check what can be checked from Python: no
``sorry``/``admit``/``native_decide``/``axiom`` in the sources, every theorem's claim id is in
the catalog and every claim with a ``lean`` checker has a theorem, every such theorem is in the
``#print axioms`` audit, and the project files are wired up.  ``lake build`` itself runs only
when ``lake`` is on PATH; otherwise that test is skipped with the reason shown by ``-ra``.
"""

from __future__ import annotations

import re

import pytest

from gauge_audit import formal

ROOT = formal.ROOT

#: claims whose catalog entry lists the `lean` checker; also checked against the catalog
LEAN_CLAIMS = set(
    """qk-gl qk-same-action qk-orthogonal-only vo-gl value-g3-eq-g0 nierop-eq14-transpose
head-perm ln-affine-rotation relu-forces-identity rope-commutant gqa-tied count-nierop
count-transformer-base count-wiki-log-hfact gqa-discrete-group head-perm-order hg-savings pith-so-stabilizer-dim
nierop-table1-arithmetic wiki-eps-mach wiki-gpt2-110m wiki-gpt2-redundancy-table wiki-gqa-wreath wiki-gqa-dim-table
wiki-gqa-percent-table""".split()
)

MODULES = "MatrixAlgebra Ring Concrete Attention Value Heads LayerNorm Activation RoPE GQA Counts Tables Axioms".split()


def _catalog():
    try:
        from gauge_audit.claims import load_catalog
    except ImportError as exc:  # pragma: no cover - the loader ships with the package
        pytest.skip(f"claim catalog loader gauge_audit.claims.load_catalog unavailable: {exc}")
    catalog = load_catalog()
    if not catalog:
        pytest.skip("claim catalog claims/*.toml is empty: nothing to cross-check yet")
    return catalog


def test_lean_no_sorry():
    assert formal.lean_files(), "no Lean sources under lean/"
    assert formal.forbidden_tokens() == []


def test_lean_scanner_sees_code_not_comments(tmp_path):
    lean = tmp_path / "lean"
    lean.mkdir()
    (lean / "A.lean").write_text(
        "/-! no `sorry` or `axiom` here: this is a docstring -/\n"
        "-- admit in a comment is fine\n"
        "theorem ok : True := trivial\n"
        "#print axioms ok\n",
        encoding="utf-8",
    )
    assert formal.forbidden_tokens(lean) == []
    (lean / "B.lean").write_text(
        "theorem bad : False := by sorry\naxiom cheat : False\ntheorem nd : 2 + 2 = 4 := by native_decide\n",
        encoding="utf-8",
    )
    found = formal.forbidden_tokens(lean)
    assert [f.rsplit(": ", 1)[1] for f in found] == ["sorry", "axiom", "native_decide"], found
    assert all(f.startswith("lean/B.lean:") for f in found), found


def test_lean_theorem_index_reads_namespaces(tmp_path):
    lean = tmp_path / "lean"
    lean.mkdir()
    (lean / "N.lean").write_text(
        "namespace Outer\n"
        "/-- first (claim `a-b`). -/\ntheorem one : True := trivial\n"
        "namespace Inner\n"
        "section S\n"
        "/-- second (claim `c`) and (claim `a-b`). -/\ntheorem two : True := trivial\n"
        "end S\n"
        "end Inner\n"
        "/-- no claim here -/\ntheorem three : True := trivial\n"
        "end Outer\n",
        encoding="utf-8",
    )
    thms = formal.theorems(lean)
    assert [(t.name, t.claims) for t in thms] == [
        ("Outer.one", ("a-b",)),
        ("Outer.Inner.two", ("c", "a-b")),
    ]
    assert formal.theorems_by_claim(lean) == {"a-b": ["Outer.one", "Outer.Inner.two"], "c": ["Outer.Inner.two"]}


def test_lean_theorems_cover_expected_claims():
    by_claim = formal.theorems_by_claim()
    missing = sorted(LEAN_CLAIMS - by_claim.keys())
    assert not missing, f"claims with a lean checker but no theorem: {missing}"
    for thm in formal.theorems():
        assert thm.name.startswith("GaugeAudit."), thm
        assert thm.file.startswith("lean/GaugeAudit/"), thm


def test_lean_theorems_cover_catalog():
    catalog = _catalog()
    by_claim = formal.theorems_by_claim()
    unknown = sorted(set(by_claim) - set(catalog))
    assert not unknown, f"Lean docstrings name claim ids missing from claims/: {unknown}"
    wanted = {cid for cid, claim in catalog.items() if "lean" in claim.checkers}
    missing = sorted(wanted - set(by_claim))
    assert not missing, f"catalog claims with a lean checker but no Lean theorem: {missing}"
    assert wanted == LEAN_CLAIMS, "the catalog's lean claims changed; update LEAN_CLAIMS and the Lean files"


def test_lean_axiom_audit_lists_every_theorem():
    guarded = formal.axiom_guarded()
    names = [t.name for t in formal.theorems()]
    missing = [n for n in names if n not in guarded]
    assert not missing, f"theorems without a #print axioms guard in {formal.AXIOMS_FILE}: {missing}"
    text = formal.AXIOMS_FILE.read_text(encoding="utf-8")
    # each check is `/-- info: 'NAME' does not depend on any axioms -/ #guard_msgs in #print axioms NAME`
    blocks = re.findall(
        r"/-- info: '([^']+)' does not depend on any axioms -/\s*#guard_msgs in\s*#print axioms (\S+)", text
    )
    assert len(blocks) == len(guarded) and all(a == b for a, b in blocks), blocks


def test_lean_project_files():
    toolchain = (ROOT / "lean-toolchain").read_text(encoding="utf-8").strip()
    assert re.fullmatch(r"leanprover/lean4:v4\.\d+\.\d+", toolchain), toolchain  # a stable tag, no -rc
    lakefile = (ROOT / "lakefile.lean").read_text(encoding="utf-8")
    assert "package «gauge-audit»" in lakefile
    assert re.search(r"@\[default_target\]\s*lean_lib GaugeAudit where\s*srcDir := \"lean\"", lakefile)
    assert "require" not in lakefile  # core Lean only: no Mathlib, no Batteries
    root = (ROOT / "lean" / "GaugeAudit.lean").read_text(encoding="utf-8")
    for mod in MODULES:
        assert (ROOT / "lean" / "GaugeAudit" / f"{mod}.lean").exists(), mod
        assert f"import GaugeAudit.{mod}\n" in root, mod
    for path in formal.lean_files():
        assert "import Mathlib" not in path.read_text(encoding="utf-8"), path
        assert "import Batteries" not in path.read_text(encoding="utf-8"), path
    workflow = (ROOT / ".github" / "workflows" / "lean.yml").read_text(encoding="utf-8")
    assert "leanprover/lean-action@v1" in workflow


def test_lean_build():
    lake = formal.lake_path()
    if lake is None:
        pytest.skip(
            "lake not on PATH: install elan (it reads lean-toolchain) and run `lake build`; "
            "CI runs it in .github/workflows/lean.yml"
        )
    result = formal.lake_build()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
