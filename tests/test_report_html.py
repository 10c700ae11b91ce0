"""The readable report: one-line reasons cut only between clauses, mathematics typeset as HTML
(matrices, powers, indices, code spans) without evaluating anything, details folded under each
claim's row, figures named, nothing fetched."""

from __future__ import annotations

import re

from gauge_audit.report.html import reason, render
from gauge_audit.report.mathtext import typeset
from gauge_audit.report.text import brief

_SUMMARY = (
    "derived: g(3) = g(0)^-1; residual of the claimed rule: Matrix([[a_00**2 - 1, a_01*(a_00 + a_11)], "
    "[a_10*(a_00 + a_11), a_11**2 - 1]]); it vanishes iff g(0)² = I"
)


def test_brief_cuts_only_between_clauses():
    short = brief(_SUMMARY, 40)
    assert short == "derived: g(3) = g(0)^-1 …"
    assert brief(_SUMMARY, 1000) == _SUMMARY
    # a first clause longer than the width is kept whole, never cut inside the matrix
    one = brief("Matrix([[1, 2], [3, 4]]) is the element; more", 10)
    assert one.startswith("Matrix([[1, 2], [3, 4]])") and one.count("[") == one.count("]")


def test_typeset_matrices_powers_indices_and_code():
    out = typeset(_SUMMARY + " and `b_O - c @ W_O` for W_Q")
    assert out.count("<table class='mx'>") == 1 and out.count("<tr>") == 2
    assert "a<sub>00</sub><sup>2</sup>" in out and "g(0)<sup>−1</sup>" in out
    assert "<code>b_O - c @ W_O</code>" in out and "W<sub>Q</sub>" in out
    assert "a<sub>01</sub>·(a" in out  # * as a product dot
    assert "value_g3_eq_g0" in typeset("value_g3_eq_g0")  # identifiers keep their underscores
    assert "&lt;script&gt;" in typeset("<script>alert(1)</script>")  # text is escaped, never markup


def test_unbalanced_matrix_text_is_shown_as_is():
    out = typeset("Matrix([[1, 2], [3")
    assert "Matrix([[1, 2], [3" in out and "<table" not in out


def _claim(**kw):
    c = {
        "id": "x-claim",
        "document": "A paper",
        "location": "Sec. 1",
        "file": "p.toml",
        "line": 3,
        "kind": "symmetry",
        "statement": "W_V ↦ W_V·N is a symmetry.",
        "verdict": "HOLDS-WITH-CORRECTION",
        "why": "not right as stated; corrected rule established (symbolic, torch)",
        "conflicts": [],
        "corrected_rule": "b_O ↦ b_O - c @ W_O",
        "counterexample": None,
        "rule": "b_V ↦ b_V + c",
        "evidence": {
            "torch": {
                "checker": "torch",
                "outcome": "HOLDS-WITH-CORRECTION",
                "summary": "rule FAILS on 1 model",
                "details": {
                    "steps": ["solve for b_O"],
                    "results": [
                        {
                            "model": "gpt2-tiny",
                            "verdict": "FAILS",
                            "max_rel_error": 0.2,
                            "residual_eps": 9e14,
                            "tolerance_eps": 2320.0,
                            "kappa": 1.0,
                        }
                    ],
                    "corrected": [
                        {
                            "model": "gpt2-tiny",
                            "verdict": "HOLDS",
                            "max_rel_error": 6e-16,
                            "residual_eps": 2.8,
                            "tolerance_eps": 2320.0,
                            "tolerance_statistical_eps": 1145.0,
                            "kappa": 1.0,
                        }
                    ],
                },
            }
        },
    }
    c.update(kw)
    return c


def test_reason_names_the_correction():
    r = reason(_claim())
    assert r.startswith("not right as stated") and "b_O ↦ b_O - c @ W_O" in r and "\n" not in r
    assert "…:" not in r


def test_report_html_folds_details_labels_rows_and_names_figures():
    data = {"seed": 0, "full": False, "summary": {"HOLDS-WITH-CORRECTION": 1}, "claims": [_claim()], "extras": {}}
    html = render(data, {"nullity_spectra.png": b"\x89PNG"})
    assert html.count("<details>") == 1 and "<table>" in html
    row = re.search(r"<tr id='x-claim'>.*?</tr>", html).group(0)
    assert "b<sub>O</sub>" in row  # the reason, typeset, in the summary row
    assert "<td>stated</td><td>gpt2-tiny</td>" in html and "<td>corrected</td><td>gpt2-tiny</td>" in html
    assert "<figcaption>Figure 1. Jacobian singular values" in html
    assert "<script" not in html and not re.search(r"""(src|href)=["'](https?:)?//""", html)
