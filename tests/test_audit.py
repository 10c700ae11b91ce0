"""`gauge-audit audit`: verdicts come from the checkers, reports are deterministic,
user claim files work, and every error path is one line with exit 2."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gauge_audit.audit.evidence import CORRECTED, FAILS, HOLDS, NOT_RUN, UNDECIDED, Evidence, combine
from gauge_audit.claims import CATALOG_DIR, load_catalog
from gauge_audit.cli import main

EXAMPLE = CATALOG_DIR / "examples" / "example_paper.toml"


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ----------------------------------------------------------------------------- combination rule
def test_combine_rules():
    h, f, c = (
        Evidence("torch", HOLDS, "h"),
        Evidence("symbolic", FAILS, "f", counterexample="x"),
        Evidence("precision", CORRECTED, "c", corrected_rule="rule"),
    )
    assert combine([h, Evidence("lean", NOT_RUN, "n")]).verdict == HOLDS
    assert combine([f]).verdict == FAILS and combine([f]).counterexample == "x"
    v = combine([h, f])
    assert v.verdict == UNDECIDED and v.conflicts == ["torch says HOLDS but symbolic says FAILS"]
    v = combine([f, c])
    assert v.verdict == CORRECTED and v.corrected_rule == "rule"
    v = combine([h, c])
    assert v.verdict == CORRECTED and v.refinements and not v.conflicts
    assert combine([Evidence("lean", NOT_RUN, "n")]).verdict == UNDECIDED


# ----------------------------------------------------------------------------- the catalog
def test_context_measures_each_torch_check_once():
    """Claims naming the same action on the same model share one measurement (the check is
    deterministic in the seed): the memo returns what a fresh check at the run's seed returns."""
    from gauge_audit.audit.checkers import Context
    from gauge_audit.numeric import check

    ctx = Context(seed=3)
    first = ctx.check("llama-tiny-gqa", "vo-gl")
    assert ctx.check("llama-tiny-gqa", "vo-gl") is first
    assert first.to_json() == check(ctx.model("llama-tiny-gqa"), "vo-gl", seed=3).to_json()
    assert ctx.check("llama-tiny-gqa", "qk-gl").to_json() != first.to_json()


def test_context_checks_real_checkpoints_on_fewer_sequences(monkeypatch):
    """The default audit runs a real checkpoint on REAL_SEQUENCES sequences (its forwards are most
    of the audit's time), --full and every other model on the four of Model.sample_inputs; a rule
    claim's torch check on the same footing as an action's."""
    from gauge_audit.audit import checkers, rule_checks
    from gauge_audit.models import build

    seen: list = []
    monkeypatch.setattr(checkers, "check", lambda model, action, inputs, seed: seen.append(inputs))
    rules: list = []
    monkeypatch.setattr(rule_checks, "check_rule", lambda model, rule, inputs, seed, label: rules.append(inputs))
    tiny = build("llama-tiny")  # stands in for the checkpoint: only the inputs are looked at
    for name, full in (("smollm2", False), ("smollm2", True), ("llama-tiny", False)):
        ctx = checkers.Context(seed=1, full=full)
        ctx.models[name] = tiny
        ctx.check(name, "qk-gl")
        rule_checks._run(None, [name], ctx, "rule")
    real, real_full, other = seen
    assert real["tokens"].shape[0] == checkers.REAL_SEQUENCES < 4
    assert real_full is None and other is None  # numeric.check draws its own four
    assert torch.equal(rules[0]["tokens"], real["tokens"]) and rules[1:] == [None, None]


def test_catalog_audit_every_claim_decided_by_checkers(catalog_report):
    report, out = catalog_report
    catalog = load_catalog()
    assert [r.claim.id for r in report.results] == list(catalog)
    for r in report.results:
        deciding = [e for e in r.evidence if e.decides]
        assert r.verdict.verdict != UNDECIDED or r.verdict.conflicts, f"{r.claim.id}: undecided without conflict"
        assert deciding, f"{r.claim.id}: no checker decided"
        assert {e.checker for e in r.evidence} == set(r.claim.checkers)
    verdicts = report.verdicts()
    # the headline findings, each produced by the checkers above
    assert verdicts["value-g3-eq-g0"] == FAILS
    assert verdicts["qk-same-action"] == FAILS
    assert verdicts["ln-affine-rotation"] == CORRECTED
    assert verdicts["relu-forces-identity"] == FAILS
    assert verdicts["qk-gl"] == HOLDS and verdicts["vo-gl"] == HOLDS
    for name in ("report.md", "report.html", "report.json", "timings.json"):
        assert (out / name).stat().st_size > 0


def test_catalog_audit_html_is_self_contained(catalog_report):
    _, out = catalog_report
    html = (out / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["'](https?:)?//""", html)
    assert "<table>" in html and "value-g3-eq-g0" in html


def test_catalog_audit_counterexamples_and_corrections_reported(catalog_report):
    data = json.loads((catalog_report[1] / "report.json").read_text(encoding="utf-8"))
    by_id = {c["id"]: c for c in data["claims"]}
    assert "g(0)" in (by_id["value-g3-eq-g0"]["evidence"]["symbolic"]["details"]["derived"])
    assert by_id["qk-same-action"]["counterexample"]
    assert by_id["ln-affine-rotation"]["corrected_rule"]
    assert "total" not in data


def test_catalog_audit_reports_both_tolerances(catalog_report):
    """The torch evidence gives the statistical tolerance beside the worst-case one, per model and in
    the summary, and the markdown report prints both."""
    data = json.loads((catalog_report[1] / "report.json").read_text(encoding="utf-8"))
    torch_ev = {c["id"]: c["evidence"]["torch"] for c in data["claims"] if "torch" in c["evidence"]}
    qk = torch_ev["qk-gl"]
    assert "statistical" in qk["summary"] and "worst-case" in qk["summary"]
    for row in qk["details"]["results"]:
        assert 0 < row["residual_eps"] <= row["tolerance_statistical_eps"] <= row["tolerance_eps"]
        assert row["verdict"] == HOLDS
    md = (catalog_report[1] / "report.md").read_text(encoding="utf-8")
    assert "ε statistical" in md and "ε worst-case" in md


# ----------------------------------------------------------------------------- determinism
def test_audit_another_seed_changes_only_the_seeded_evidence(catalog_report, tmp_path, capsys):
    """The same seed gives the same report.json byte for byte (tests/test_threads.py: a fresh process
    at another thread count against the session's catalog audit).  Another seed draws other
    elements, inputs and counterexample data: the entries whose evidence comes from such draws
    change, an exact derivation does not."""
    seeded, exact = ["ln-affine-rotation", "relu-forces-identity"], ["value-g3-eq-g0"]
    argv = ["audit", "--only", ",".join(seeded + exact), "--seed", "4", "--out", str(tmp_path / "r"), "--quiet"]
    assert _run(argv, capsys)[0] == 0

    def entries(path):
        claims = json.loads(path.read_text(encoding="utf-8"))["claims"]
        return {c["id"]: json.dumps(c, sort_keys=True, ensure_ascii=False) for c in claims}

    other, catalog = entries(tmp_path / "r" / "report.json"), entries(catalog_report[1] / "report.json")
    assert sorted(other) == sorted(seeded + exact)
    for claim in seeded:
        assert other[claim] != catalog[claim], claim
    for claim in exact:
        assert other[claim] == catalog[claim], claim


# ----------------------------------------------------------------------------- user claim files
ACTION_CLAIMS = "example-relu-rescaling,example-gelu-rescaling,example-stream-rotation,example-attention-dimension"


def test_audit_example_user_claim_file(tmp_path, capsys):
    """The example's claims that name actions and a formula (its rule claims: tests/test_rules_audit.py)."""
    code, out, _ = _run(
        ["audit", str(EXAMPLE), "--only", ACTION_CLAIMS, "--out", str(tmp_path / "r"), "--quiet"], capsys
    )
    assert code == 0
    data = json.loads((tmp_path / "r" / "report.json").read_text(encoding="utf-8"))
    got = {c["id"]: c["verdict"] for c in data["claims"]}
    assert got == {
        "example-relu-rescaling": HOLDS,
        "example-gelu-rescaling": FAILS,
        "example-stream-rotation": CORRECTED,
        "example-attention-dimension": FAILS,
    }
    dim = next(c for c in data["claims"] if c["id"] == "example-attention-dimension")["evidence"]["nullity"]
    assert "measured symmetry dimension 16" in dim["summary"]  # h(d_k² + d_v²) = 2·(4 + 4), not 2·1 + 8
    assert "example-gelu-rescaling" in out and "FAILS" in out


def test_audit_fail_on(tmp_path, capsys):
    assert (
        _run(
            [
                "audit",
                str(EXAMPLE),
                "--only",
                "example-gelu-rescaling",
                "--out",
                str(tmp_path / "a"),
                "--quiet",
                "--fail-on",
                "FAILS",
            ],
            capsys,
        )[0]
        == 1
    )
    assert (
        _run(
            [
                "audit",
                str(EXAMPLE),
                "--only",
                "example-relu-rescaling",
                "--out",
                str(tmp_path / "b"),
                "--quiet",
                "--fail-on",
                "FAILS",
            ],
            capsys,
        )[0]
        == 0
    )


def test_audit_json_output(tmp_path, capsys):
    code, out, _ = _run(
        ["audit", "--only", "count-wiki-log-hfact", "--out", str(tmp_path / "r"), "--quiet", "--json"], capsys
    )
    assert code == 0 and json.loads(out)["claims"][0]["verdict"] == FAILS


# ----------------------------------------------------------------------------- error paths
@pytest.mark.parametrize(
    "text,match,problems",
    [
        # title mistyped, authors and reference missing: all three in one run
        ("[document]\ntitle = 1\n", r"bad\.toml:2: field document\.title", 3),
        # location, statement, kind and checkers missing
        ("[document]\ntitle='t'\nauthors=['a']\nreference='r'\n[[claim]]\nid='x'\n", r"bad\.toml:5: field location", 4),
        ("this is not toml", r"bad\.toml:1: TOML syntax error", 1),
        (
            "[document]\ntitle='t'\nauthors=['a']\nreference='r'\n[[claim]]\nid='x'\nlocation='l'\nstatement='s'\n"
            "kind='symmetry'\ncheckers=['torch']\naction='no-such-action'\n",
            r"bad\.toml:11: field action",
            1,
        ),
        (
            "[document]\ntitle='t'\nauthors=['a']\nreference='r'\n[[claim]]\nid='x'\nlocation='l'\nstatement='s'\n"
            "kind='count'\ncheckers=['symbolic']\nformula='__import__(\"os\")'\n",
            r"bad\.toml:11: field formula",
            1,
        ),
    ],
)
def test_audit_malformed_claim_file_one_line_per_problem_exit_2(tmp_path, capsys, text, match, problems):
    bad = tmp_path / "bad.toml"
    bad.write_text(text, encoding="utf-8")
    code, _, err = _run(["audit", str(bad), "--out", str(tmp_path / "r")], capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == problems and re.search(match, err), err
    assert all(re.match(rf"gauge-audit: error: {re.escape(str(bad))}:\d+: ", ln) for ln in lines), err


@pytest.mark.parametrize(
    "argv,match",
    [
        (["audit", "--only", "no-such-claim"], "unknown claim id"),
        (["audit", "--fail-on", "MAYBE"], "--fail-on"),
        (["audit", "/nonexistent/claims.toml"], "cannot read claim file"),
    ],
)
def test_audit_cli_errors_one_line_exit_2(tmp_path, capsys, argv, match):
    code, _, err = _run(argv + ["--out", str(tmp_path / "r")], capsys)
    assert code == 2 and err.count("\n") == 1 and match in err, err


@pytest.mark.parametrize("width", [100, 120, 140, 180])
def test_catalog_audit_terminal_table_fits_the_terminal_width(catalog_report, width):
    """Every line of the verdict table fits the width it is drawn for (a line that does not wraps in
    the terminal and scrambles the columns), and nothing the 140-column table shows is dropped."""
    from gauge_audit.report import terminal_table

    report, _ = catalog_report
    text = terminal_table(report, width=width)
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, too_long[:3]
    for r in report.results:
        assert r.claim.id in text and r.verdict.verdict in text
