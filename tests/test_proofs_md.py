"""proofs.md cannot drift from the catalog, the Lean files, the tests or the audit:
it must equal the generator's output for the audit's verdicts."""

from __future__ import annotations

import json

from gauge_audit.claims import load_catalog
from gauge_audit.report import proofs_md


def test_proofs_md_is_up_to_date_and_agrees_with_the_report(catalog_report):
    report, out = catalog_report
    expected = proofs_md.render(report)
    current = proofs_md.PROOFS_MD.read_text(encoding="utf-8")
    assert current == expected, "proofs.md is stale: python -m gauge_audit.report.proofs_md --write"
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    rows = {ln.split("`")[1]: ln.rsplit("|", 2)[1].strip() for ln in current.splitlines() if ln.startswith("| `")}
    assert rows == {c["id"]: c["verdict"] for c in data["claims"]}


def test_proofs_md_one_row_per_claim():
    cat = load_catalog()
    text = proofs_md.PROOFS_MD.read_text(encoding="utf-8")
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list(cat)
    row = next(r for r in rows if r.startswith("| `value-g3-eq-g0`"))
    assert "FAILS" in row and "gauge_audit.symbolic.value_g3_eq_g0" in row


def test_proofs_md_test_matching_prefers_longest_id(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "def test_qk_gl_basic():\n    pass\n"
        "def test_qk_gl_rope_generic_breaks():\n    pass\n"
        "def test_qk_glx():\n    pass\n"
        "def test_qk_gl():\n    pass\n",
        encoding="utf-8",
    )
    found = proofs_md.tests_by_claim(["qk-gl", "qk-gl-rope-generic"], tmp_path)
    assert found["qk-gl"] == ["test_x.py::test_qk_gl_basic", "test_x.py::test_qk_gl"]
    assert found["qk-gl-rope-generic"] == ["test_x.py::test_qk_gl_rope_generic_breaks"]
