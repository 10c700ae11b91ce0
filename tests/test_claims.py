"""The claim catalog: every required id loads, the loader rejects bad files with FILE:LINE, formulas are parsed safely."""

from __future__ import annotations

import json
import textwrap

import pytest
import sympy as sp

from gauge_audit.audit.nullity_checks import _catalog_checks
from gauge_audit.claims import CATALOG_DIR, load_catalog, load_file
from gauge_audit.claims.expr import evaluate_formula, parse_formula
from gauge_audit.cli import _Parser
from gauge_audit.cli import claims as cli_claims
from gauge_audit.cli import derive as cli_derive
from gauge_audit.errors import GaugeAuditError
from gauge_audit.experiments import EXPERIMENTS
from gauge_audit.symbolic import DERIVATIONS

NULLITY_CHECKS = _catalog_checks(full=False)

REQUIRED = """qk-gl qk-same-action qk-orthogonal-only vo-gl head-perm value-g3-eq-g0 nierop-eq14-transpose
ln-affine-rotation ln-reviewer-no-fix ln-noaffine-rotation rmsnorm-rotation relu-forces-identity rope-commutant
gqa-tied gqa-wiki-formula moe-routing moe-expert-perm count-nierop count-transformer-base count-wiki-log-hfact
maximality eps-24 wiki-1e-12 fdof-bound""".split()
LEAN = set(
    """qk-gl qk-same-action qk-orthogonal-only vo-gl value-g3-eq-g0 nierop-eq14-transpose head-perm
ln-affine-rotation relu-forces-identity rope-commutant gqa-tied count-nierop count-transformer-base
count-wiki-log-hfact gqa-discrete-group head-perm-order hg-savings pith-so-stabilizer-dim nierop-table1-arithmetic
wiki-eps-mach wiki-gpt2-110m wiki-gpt2-redundancy-table wiki-gqa-wreath wiki-gqa-dim-table wiki-gqa-percent-table""".split()
)

GOOD = """
[document]
title = "T"
authors = ["A"]
reference = "R"

[[claim]]
id = "x-one"
location = "eq. 1"
statement = "s"
kind = "count"
checkers = ["symbolic"]
formula = "a^2 + 1"
"""


def _write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def test_catalog_has_every_required_id():
    cat = load_catalog()
    missing = [c for c in REQUIRED if c not in cat]
    assert not missing
    assert len({c.file for c in cat.values()}) == 3
    assert sorted(p.name for p in CATALOG_DIR.glob("*.toml")) == [
        "maximal_gauge_symmetry.toml",
        "van_nierop_2412_14543.toml",
        "wiki_zh.toml",
    ]


def test_catalog_lean_checkers_exact():
    cat = load_catalog()
    assert {c.id for c in cat.values() if "lean" in c.checkers} == LEAN


def test_catalog_symbolic_results_for_algebraic_kinds():
    cat = load_catalog()
    for c in cat.values():
        if c.kind in ("symmetry", "derivation", "count"):
            # settled by a SymPy derivation, or (groups by enumeration, losses, Hessians, several models)
            # by an experiment, or by the nullity measurement of the catalog's small configurations
            assert c.id in DERIVATIONS or c.id in EXPERIMENTS or c.id in NULLITY_CHECKS or c.action, c.id
            if c.id in DERIVATIONS:
                assert "symbolic" in c.checkers, c.id
            if c.id in EXPERIMENTS:
                assert "torch" in c.checkers and not c.action, c.id
    assert set(DERIVATIONS) <= set(cat)
    assert set(EXPERIMENTS) <= set(cat)


def test_catalog_claims_are_frozen():
    c = load_catalog()["count-nierop"]
    with pytest.raises(AttributeError):  # a frozen dataclass
        c.id = "other"
    with pytest.raises(TypeError):
        c.params["models"] = ()
    assert c.claimed_percent == (1.3, 0.7, 0.3)
    assert c.params["models"][0]["d_e"] == 768


def test_loader_accepts_good_file(tmp_path):
    doc, claims = load_file(_write(tmp_path, GOOD))
    assert doc.title == "T" and claims[0].id == "x-one" and claims[0].line == 7
    assert claims[0].formula_expr == sp.Symbol("a", positive=True) ** 2 + 1


@pytest.mark.parametrize(
    "mutation, line, field",
    [
        (('kind = "count"', 'kind = "count"\ncolour = "red"'), 12, "colour"),
        (('statement = "s"\n', ""), 7, "statement"),
        (('checkers = ["symbolic"]', 'checkers = ["symbolic", "oracle"]'), 12, "checkers"),
        (('kind = "count"', "kind = 3"), 11, "kind"),
        (('formula = "a^2 + 1"', "formula = \"__import__('os')\""), 13, "formula"),
        (('id = "x-one"', 'id = "X One"'), 8, "id"),
    ],
)
def test_loader_errors_name_file_line_field(tmp_path, mutation, line, field):
    p = _write(tmp_path, GOOD.replace(*mutation))
    with pytest.raises(GaugeAuditError) as e:
        load_file(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}:"), msg
    assert field in msg


def test_loader_reports_every_field_error_in_one_run(tmp_path, capsys):
    """Missing authors and reference, a bad kind, an unknown checker and an unknown key in a
    second claim: all five lines in one error, in file order, and the CLI prints each and exits 2."""
    text = GOOD.replace('authors = ["A"]\n', "").replace('reference = "R"\n', "")
    text = text.replace('kind = "count"', 'kind = "opinion"') + textwrap.dedent("""
        [[claim]]
        id = "x-two"
        location = "eq. 2"
        statement = "t"
        kind = "count"
        checkers = ["symbolic", "oracle"]
        colour = "red"
        """)
    p = _write(tmp_path, text)
    with pytest.raises(GaugeAuditError) as e:
        load_file(p)
    lines = e.value.lines
    assert len(lines) == 5, lines
    assert all(ln.startswith(f"{p}:") for ln in lines)
    for field, ln in zip(("document.authors", "document.reference", "kind", "checkers", "colour"), lines):
        assert f"field {field}" in ln, (field, ln)
    nums = [int(ln.split(":")[1]) for ln in lines]
    assert nums == sorted(nums)

    from gauge_audit.cli import main

    assert main(["claims", "--file", str(p)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5 and all(ln.startswith(f"gauge-audit: error: {p}:") for ln in err)
    # once fixed, the same file loads
    good = text.replace('kind = "opinion"', 'kind = "count"').replace(', "oracle"', "").replace('colour = "red"\n', "")
    good = good.replace('title = "T"\n', 'title = "T"\nauthors = ["A"]\nreference = "R"\n')
    assert [c.id for c in load_file(_write(tmp_path, good, "fixed.toml"))[1]] == ["x-one", "x-two"]


def test_loader_errors_of_every_catalog_file_together(tmp_path):
    a = _write(tmp_path, GOOD.replace('kind = "count"', "kind = 1"), "a.toml")
    b = _write(tmp_path, GOOD.replace('id = "x-one"', 'id = "x-two"').replace('location = "eq. 1"\n', ""), "b.toml")
    with pytest.raises(GaugeAuditError) as e:
        load_catalog([a, b])
    assert [ln.split(":")[0] for ln in e.value.lines] == [str(a), str(b)]


def test_loader_duplicate_ids_across_files(tmp_path):
    a = _write(tmp_path, GOOD, "a.toml")
    b = _write(tmp_path, GOOD, "b.toml")
    with pytest.raises(GaugeAuditError, match=r"b\.toml:8: field id: duplicate id 'x-one'"):
        load_catalog([a, b])


def test_loader_duplicate_ids_within_file(tmp_path):
    text = GOOD + GOOD.split("[[claim]]")[1].join(["\n[[claim]]", ""])
    with pytest.raises(GaugeAuditError, match="duplicate id"):
        load_file(_write(tmp_path, text))


def test_loader_toml_syntax_and_missing_document(tmp_path):
    with pytest.raises(GaugeAuditError, match=r"c\.toml:3: TOML syntax error"):
        load_file(_write(tmp_path, '[document]\ntitle = "x"\nauthors = [\n'))
    with pytest.raises(GaugeAuditError, match="document"):
        load_file(_write(tmp_path, '[[claim]]\nid = "a"\n'))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2*n_t*n_h*d_h^2 + (d_e-1)*(d_e-2)/2", None),
        ("h*(d_k^2+d_v^2) + log(h!)", None),
        ("2**3 - -1", 9),
        ("binomial(5, 2) + 3!", 16),
    ],
)
def test_expr_parser(text, expected):
    e = parse_formula(text)
    if expected is not None:
        assert e == expected


@pytest.mark.parametrize(
    "text", ["__import__('os')", "a.b", "eval(1)", "x; y", "2 +", "log(1, 2)", "(1", "a[0]", "lambda: 1", "1 / 0"]
)
def test_expr_parser_rejects(text):
    with pytest.raises(GaugeAuditError, match="formula"):
        parse_formula(text)


def test_expr_parser_whitelist_and_values():
    with pytest.raises(GaugeAuditError, match="unknown name 'z'"):
        parse_formula("a + z", names={"a"})
    assert (
        evaluate_formula("2*n_t*n_h*d_h^2 + (d_e-1)*(d_e-2)/2", {"n_t": 12, "n_h": 12, "d_h": 64, "d_e": 768})
        == 1473409
    )


def _cli(argv):
    parser = _Parser(prog="gauge-audit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cli_derive.register(sub)
    cli_claims.register(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except GaugeAuditError as exc:
        import sys

        sys.stderr.write(f"gauge-audit: error: {exc}\n")
        return 2


def test_cli_claims_lists_catalog(capsys):
    assert _cli(["claims"]) == 0
    out = capsys.readouterr().out
    for cid in REQUIRED:
        assert cid in out
    assert _cli(["claims", "--json", "--kind", "count"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {d["kind"] for d in data} == {"count"} and any(d["id"] == "count-nierop" for d in data)


def test_value_g3_eq_g0_cli_reports_fails(capsys):
    assert _cli(["derive", "value-g3-eq-g0"]) == 0
    out = capsys.readouterr().out
    assert "Verdict: FAILS" in out and "g(3) = g(0)^-1" in out
    assert _cli(["derive", "value-g3-eq-g0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["claim"] == "value-g3-eq-g0" and data["verdict"] == "FAILS"
    assert {"derived", "residual"} <= set(data)
    assert _cli(["derive", "value-g3-eq-g0", "--latex"]) == 0
    assert "\\left[" in capsys.readouterr().out


def test_cli_derive_list_and_unknown(capsys):
    assert _cli(["derive", "--list"]) == 0
    assert "value-g3-eq-g0" in capsys.readouterr().out
    assert _cli(["derive", "no-such-claim"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown claim id 'no-such-claim'" in err
    assert _cli(["derive", "eps-24"]) == 2
    assert "no symbolic derivation" in capsys.readouterr().err


def test_cli_dispatcher_lists_subcommands():
    from gauge_audit.cli import SUBCOMMANDS

    assert "derive" in SUBCOMMANDS and "claims" in SUBCOMMANDS
