"""The audit on worker processes gives the serial audit's report.json byte for byte: every kind
of unit the plan makes (a real checkpoint's checks, the small models' checks, a rule claim's
checkers, the nullity checks, the float error study, an experiment, Lean) in one comparison; a
worker that dies stops the audit with one line; the budget of --max-minutes holds there too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gauge_audit.audit import parallel
from gauge_audit.audit.checkers import Context
from gauge_audit.audit.evidence import NOT_RUN
from gauge_audit.audit.run import audit
from gauge_audit.claims import load_catalog
from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "claims" / "examples" / "example_paper.toml"
WIKI = ROOT / "claims" / "wiki_zh.toml"

# A real checkpoint (MiniLM, cheap) beside small models, one claim file of the user's.
MINILM = """
[document]
key = "parallel"
title = "Worker processes of the audit"
authors = ["gauge-audit"]
reference = "tests/test_audit_parallel.py"

[[claim]]
id = "minilm-vo-gl"
location = "test"
statement = "The value/output GL action leaves MiniLM and a tiny GPT-2 unchanged."
kind = "symmetry"
checkers = ["torch", "precision"]
action = "vo-gl"
expected = "holds"
models = ["minilm", "gpt2-tiny"]
"""

ONLY = ",".join(
    [
        "minilm-vo-gl",  # a real checkpoint's unit and the small models' unit
        "example-value-shift",  # a rule claim: its checkers in one unit
        "example-attention-dimension",  # nullity
        "wiki-1e-12",  # the float error study (and its plot)
        "wiki-align-models",  # an experiment
        "wiki-qk-lemma1",  # Lean and SymPy
    ]
)


def _files(tmp_path: Path) -> list[str]:
    mine = tmp_path / "minilm.toml"
    mine.write_text(MINILM, encoding="utf-8")
    return [str(WIKI), str(EXAMPLE), str(mine)]


def _audit(tmp_path: Path, name: str, jobs: int, capsys) -> bytes:
    out = tmp_path / name
    argv = ["audit", *_files(tmp_path), "--only", ONLY, "--out", str(out), "--quiet", "--jobs", str(jobs)]
    assert main(argv) == 0
    capsys.readouterr()
    return (out / "report.json").read_bytes()


def test_parallel_report_byte_identical_to_serial(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the catalog's claim files as the catalog names them (claims/…)
    serial = _audit(tmp_path, "serial", 1, capsys)
    two = _audit(tmp_path, "two", 2, capsys)
    assert serial == two
    data = json.loads(serial)
    assert {c["id"] for c in data["claims"]} == set(ONLY.split(","))
    for plot in ("error_vs_kappa.png", "nullity_spectra.png"):  # from what the workers handed back
        assert (tmp_path / "two" / plot).read_bytes() == (tmp_path / "serial" / plot).read_bytes()
    minilm = next(c for c in data["claims"] if c["id"] == "minilm-vo-gl")
    assert [r["model"] for r in minilm["evidence"]["torch"]["details"]["results"]] == ["minilm", "gpt2-tiny"]
    timings = json.loads((tmp_path / "two" / "timings.json").read_text(encoding="utf-8"))
    assert "unit minilm" in timings and "unit small models" in timings


def test_plan_units_share_what_they_compute(monkeypatch):
    monkeypatch.chdir(ROOT)
    catalog = load_catalog()
    plan = parallel.plan(list(catalog.values()))
    labels = [u.label for u in plan.units]
    # the real checkpoints first, biggest first; each read by one unit only
    assert labels[:3] == ["gemma3", "smollm2", "minilm"]
    smollm2 = next(u for u in plan.units if u.label == "smollm2")
    assert {m for m, _ in smollm2.pairs} == {"smollm2", "smollm2-untied"}
    assert len({u.label for u in plan.units}) == len(plan.units)
    nullity = next(u for u in plan.units if u.label == "nullity")
    assert len(nullity.tasks) == sum("nullity" in c.checkers for c in catalog.values())
    # every torch step of an action claim is assembled from the units' checks
    for (i, name), pairs in plan.assembled.items():
        claim = list(catalog.values())[i]
        assert name == "torch" and all(a in (claim.action, claim.corrected_action) for _, a in pairs)
        assert pairs or not claim.action  # every action of the catalog applies to some model


def test_default_jobs_one_for_small_work():
    small = [load_catalog([EXAMPLE])["example-relu-rescaling"]]
    assert parallel.default_jobs(parallel.plan(small), small) == 1
    cores = len(os.sched_getaffinity(0))
    claims = list(load_catalog().values())
    assert parallel.default_jobs(parallel.plan(claims), claims) == min(cores, parallel.MAX_JOBS)


def test_dead_worker_one_line_error(monkeypatch):
    """A worker killed mid-run (as the out-of-memory killer would) ends the audit with an error
    naming its exit code, not a hang."""
    claims = list(load_catalog([EXAMPLE]).values())[:3]

    def die(unit, *args):
        os._exit(3)

    monkeypatch.setattr(parallel, "_run_unit", die)
    if parallel._start_method("cpu") != "fork":
        pytest.skip("the patched worker reaches the children only through fork")
    with pytest.raises(GaugeAuditError, match="exit code 3"):
        audit(claims, Context(), jobs=2)


def test_deadline_holds_on_workers():
    """A budget that ends at once: every step NOT-RUN on worker processes as in the serial run."""
    claims = [c for c in load_catalog([EXAMPLE]).values()][:4]
    serial = audit(claims, Context(), max_minutes=1e-9, jobs=1)
    two = audit(claims, Context(), max_minutes=1e-9, jobs=2)
    assert serial.to_json() == two.to_json()
    assert {e.outcome for r in two.results for e in r.evidence} == {NOT_RUN}


def test_bad_jobs_one_line_error(capsys, tmp_path):
    assert main(["audit", "--only", "qk-gl", "--jobs", "-1", "--out", str(tmp_path / "r")]) != 0
    err = capsys.readouterr().err
    assert "--jobs" in err and "Traceback" not in err
