"""The README and the documentation site: the site builds strictly, the generated catalog page is
current, every shown example is executed and its output compared (tests/docs_examples.py), and
the README stays a five-minute read that speaks of the project."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from docs_examples import PAGES, ROOT, examples, normalise, prepare, run, run_all, same_output, unmarked

# Examples shown with their output but not executed, each with why (the page says the same in its marker).
TRAINED = "needs the trained models of benchmarks/train_models.py (8 CPU-minutes); tests/test_merge.py runs the same paths on tiny trained pairs"
NOT_EXECUTED = {
    (
        "docs/commands/check.md",
        "gauge-audit check --model smollm2 --action qk-gl",
    ): "reads the 135 M-parameter SmolLM2; tests/test_checkpoint_gguf.py runs the same path",
    (
        "docs/commands/canonicalize.md",
        "gauge-audit canonicalize --model smollm2 --out smol-canon",
    ): "canonicalizes 135 M parameters; tests/test_gauge_fix_checkpoint.py runs the same path",
    (
        "docs/commands/canonicalize.md",
        "gauge-audit canonicalize --checkpoint ./my-glm --out ./canon",
    ): "needs a checkpoint written by transformers; tests/test_derived_operations.py runs this path",
    **{
        (page, cmd): TRAINED
        for page, cmd in (
            (
                "docs/commands/merge.md",
                "gauge-audit merge models/llama-seed0 models/llama-seed1 --alpha 0.5 --align --out llama-merged",
            ),
            (
                "docs/commands/barrier.md",
                "gauge-audit barrier models/llama-seed0 models/llama-seed1 --data models/heldout.txt --plot barrier-llama.png",
            ),
            (
                "docs/commands/barrier.md",
                "gauge-audit barrier models/gpt2-seed0 models/llama-seed0 --data models/heldout.txt",
            ),
            (
                "docs/commands/barrier.md",
                "gauge-audit barrier models/gpt2-seed0 models/gpt2-seed1 --align --data models/heldout.txt --plot barrier-gpt2.png --max-seconds 60",
            ),
        )
    },
}


def _rel(page) -> str:
    return str(page.relative_to(ROOT))


def test_readme_is_short_and_keeps_the_test_command():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "bash scripts/with-venv.sh python -m pytest -q" in text
    assert "[document]" in text and "reference =" in text and 'kind = "symmetry"' in text


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_pages_cite_public_sources(page):
    """A page cites the papers by their public references, not by a path a clone elsewhere lacks
    (the catalog page reproduces claims/*.toml's own reference fields)."""
    text = page.read_text(encoding="utf-8")
    if page.name != "catalog.md":
        assert not re.search(r"shared/seeds", text), _rel(page)


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        assert (ROOT / link).exists(), link


def test_catalog_page_is_current():
    from gauge_audit.report.catalog_md import CATALOG_MD, render

    assert CATALOG_MD.read_text(encoding="utf-8") == render(), (
        "docs/catalog.md is stale: python -m gauge_audit.report.catalog_md --write"
    )


def test_groups_table_is_current():
    """The architecture table of docs/concepts/checkpoints.md is what `gauge-audit groups` derives today."""
    from gauge_audit.report.groups_md import PAGE, render

    assert PAGE.read_text(encoding="utf-8") == render(), (
        "the groups table is stale: python -m gauge_audit.report.groups_md --write"
    )


def test_every_shown_output_is_marked_and_not_run_ones_are_listed():
    listed = set()
    for page in PAGES:
        assert not unmarked(page), f"{_rel(page)}: console blocks with output but no run/not-run marker"
        for ex in examples(page):
            if ex.mode == "not-run":
                assert ex.reason
                for cmd, _ in ex.commands:
                    assert (_rel(page), cmd) in NOT_EXECUTED, f"{_rel(page)}: {cmd} is not run and not listed"
                    listed.add((_rel(page), cmd))
    assert listed == set(NOT_EXECUTED)


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs / mkdocs-material not installed (the test and docs extras)",
)
def test_site_builds_strictly(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]


def _cmp_pages():
    return [(page, ex) for page in PAGES for ex in examples(page) if ex.mode in ("run", "slow")]


@pytest.fixture(scope="session")
def docs_runs(tmp_path_factory):
    """Every executed example once, in one working directory prepared as a user's would be."""
    cwd = tmp_path_factory.mktemp("docs-examples")
    prepare(cwd)
    pages = [p for p in PAGES if any(ex.mode in ("run", "slow") for ex in examples(p))]
    # "run: catalog" examples are compared with the session's catalog audit instead (below)
    return cwd, run_all(cwd, pages)


@pytest.mark.parametrize("page", [p for p in PAGES if any(ex.mode in ("run", "slow") for ex in examples(p))], ids=_rel)
def test_shown_outputs_are_what_the_commands_print(page, docs_runs):
    cwd, results = docs_runs
    for ex in examples(page):
        if ex.mode not in ("run", "slow"):
            continue
        for cmd, shown in ex.commands:
            got = normalise(results[cmd][1], cwd)
            assert same_output(normalise(shown), got), f"{_rel(page)}: `{cmd}` prints\n{got}"


@pytest.mark.parametrize("page", [p for p in PAGES if any(ex.mode == "catalog" for ex in examples(p))], ids=_rel)
def test_docs_catalog_examples_match_the_catalog_audit(page, catalog_report):
    """`gauge-audit audit [--only …]` blocks: the same table the CLI prints, from the session's catalog audit
    (each claim's checks draw from the claim's own seed, so a subset audits as it does in the whole)."""
    from gauge_audit.audit.run import AuditReport
    from gauge_audit.report import terminal_table

    report, _ = catalog_report
    for ex in examples(page):
        if ex.mode != "catalog":
            continue
        for cmd, shown in ex.commands:
            only = re.search(r"--only (\S+)", cmd)
            out = re.search(r"--out (\S+)", cmd).group(1)
            ids = only.group(1).split(",") if only else [r.claim.id for r in report.results]
            by_id = {r.claim.id: r for r in report.results}
            sub = AuditReport(report.seed, report.full, [by_id[i] for i in ids])
            got = terminal_table(sub) + f"\nreport: {out}/report.md, {out}/report.html, {out}/report.json"
            assert same_output(normalise(shown), normalise(got)), f"{_rel(page)}: `{cmd}` prints\n{got}"


def test_example_runner_rejects_other_commands(tmp_path):
    with pytest.raises(ValueError):
        run("rm -rf /", tmp_path)


def test_readme_count_table_is_the_one_in_proofs_md():
    """The README's per-document verdict counts are the generated table of proofs.md, row for row."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    proofs = (ROOT / "proofs.md").read_text(encoding="utf-8").splitlines()
    start = readme.index(next(line for line in readme if line.startswith("| document | claims |")))
    rows = [line for line in readme[start:] if line.startswith("|")]
    rows = rows[: next(i for i, r in enumerate(rows) if r.startswith("| total")) + 1]
    at = proofs.index(rows[0])
    assert proofs[at : at + len(rows)] == rows


def test_same_output_allows_rounding_digits_and_nothing_else():
    """The comparison of shown outputs lets a rounding-level decimal move within the factor and
    rejects a changed verdict, count, or a number off by an order of magnitude."""
    shown = "gpt2-tiny  qk-gl  6.331e-16  2.851  1145  2320  10  HOLDS  (1,218,816 conditions)"
    assert same_output(shown, "gpt2-tiny  qk-gl    6.906e-16   3.11  1145  2320  10  HOLDS  (1,218,816 conditions)")
    assert not same_output(shown, shown.replace("HOLDS", "FAILS"))
    assert not same_output(shown, shown.replace("1145", "1146"))
    assert not same_output(shown, shown.replace("1,218,816", "1,218,817"))
    assert not same_output(shown, shown.replace("2.851", "28.51"))
    assert not same_output(shown, shown.replace("6.331e-16", "6.331e-13"))
    assert not same_output(shown, shown.replace("2.851", "-2.851"))
    assert not same_output(shown, shown + " extra")
    # a residual in ε that prints without decimals is a measurement: within the factor, not exact
    measured = "κ 10: 8 ε, κ 10000: 3.77e+03 ε, dps 100: 5.09e-100, 118 directions"
    assert same_output(measured, "κ 10: 7 ε, κ 10000: 8.18e+03 ε, dps 100: 1.29e-99, 118 directions")
    assert not same_output(measured, measured.replace("8 ε", "80 ε"))
    assert not same_output(measured, measured.replace("118 directions", "119 directions"))
