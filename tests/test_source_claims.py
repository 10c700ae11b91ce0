"""The new source statements: conventions, table cells and the read-but-not-checkable rows."""

from __future__ import annotations

import pytest

from gauge_audit.claims import load_catalog, load_text, load_unchecked
from gauge_audit.errors import GaugeAuditError
from gauge_audit.report.documents import COLUMNS, count_rows
from gauge_audit.symbolic import DERIVATIONS
from gauge_audit.symbolic.wiki_checks import _gqa_readings, gpt2_small_parameters


def test_wiki_vo_convention_rule_undefined_and_correction_exact():
    d = DERIVATIONS["wiki-vo-convention"]()
    assert d.verdict == "HOLDS-WITH-CORRECTION"
    assert d.data == {
        "rule_defined_for_d_model_ne_d_v": False,
        "square_residual_zero": False,
        "corrected_residual_zero": True,
    }


def test_wiki_theorem3_left_action_wrong_law_rejected_right_action_exact():
    d = DERIVATIONS["wiki-theorem3-left-action"]()
    assert d.verdict == "HOLDS-WITH-CORRECTION"
    assert not d.data["left_defined"] and not d.data["left_square_residual_zero"] and d.data["right_ok"]


def test_wiki_gqa_percent_table_every_reading_computed():
    rows = _gqa_readings()
    assert rows and not any(r["matches"] for r in rows)
    # the table's 50 % alone is reproducible (16 heads, 8 K/V heads, the true group): the cells are computed
    assert any(r["h"] == 16 and r["formula"] == "true" and r["gqa8"] == 50.0 for r in rows)
    assert DERIVATIONS["wiki-gqa-percent-table"]().verdict == "FAILS"


def test_wiki_gpt2_110m_is_124m():
    assert gpt2_small_parameters() == 124_439_808
    assert DERIVATIONS["wiki-gpt2-110m"]().verdict == "FAILS"


def test_nierop_skip_ties_and_skip_rotations():
    assert DERIVATIONS["nierop-skip-rotations"]().residual == "0"
    ties = DERIVATIONS["nierop-skip-ties"]()
    assert ties.verdict == "HOLDS" and "non-zero" in ties.steps[-1]


def test_unchecked_rows_loaded_and_a_bad_row_rejected():
    rows = load_unchecked()
    assert {u.document.key for u in rows} == {"mgs", "van-nierop", "wiki-zh"}
    assert all(u.quote and u.location and u.reason for u in rows)
    text = (
        '[document]\ntitle = "t"\nauthors = ["a"]\nreference = "r"\n\n'
        '[[unchecked]]\nquote = "q"\nlocation = "s"\n\n[[unchecked]]\nquote = "q"\nreason = "r"\nextra = 1\n'
    )
    with pytest.raises(GaugeAuditError) as exc:
        load_text(text, "x.toml")
    lines = exc.value.lines
    assert any(ln.startswith("x.toml:6:") and "unchecked.reason" in ln for ln in lines)
    assert any(ln.startswith("x.toml:10:") and "unchecked.extra" in ln for ln in lines)


def test_document_count_rows_add_up():
    class R:  # the two fields count_rows reads
        def __init__(self, claim, verdict):
            self.claim, self.verdict = claim, type("V", (), {"verdict": verdict})

    cat = list(load_catalog().values())
    results = [R(c, "FAILS" if i % 2 else "HOLDS") for i, c in enumerate(cat)]
    rows = count_rows(results, load_unchecked())
    total = rows[-1]
    assert total[0] == "total" and total[1] == len(cat) == sum(total[2:6])
    assert total[COLUMNS.index("read but not checkable")] == len(load_unchecked())
