"""The CI wiring: `.ci/run` runs the lint, format and type checks, then exactly the README's test
command, and the GitHub workflow for the Python side runs `.ci/run` on ubuntu-latest with Python
3.11 and the same torch pin."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_COMMAND = "bash scripts/with-venv.sh python -m pytest -q"


CHECK_COMMANDS = [
    "bash scripts/with-venv.sh ruff check python tests benchmarks",
    "bash scripts/with-venv.sh ruff format --check python tests benchmarks",
    "bash scripts/with-venv.sh mypy",
]


def test_ci_run_is_the_checks_then_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert TEST_COMMAND in readme
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [ln for ln in run.splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    assert commands == [*CHECK_COMMANDS, TEST_COMMAND]


def test_python_workflow_runs_ci_with_the_pinned_torch():
    wf = (ROOT / ".github" / "workflows" / "python.yml").read_text(encoding="utf-8")
    assert re.search(r"runs-on:\s*ubuntu-latest", wf)
    assert re.search(r"python-version:\s*\"3\.11\"", wf)
    assert re.search(r"run:\s*bash \.ci/run", wf)
    assert "download.pytorch.org/whl/cpu" in wf  # the CPU build of the pinned torch
    venv = (ROOT / "scripts" / "with-venv.sh").read_text(encoding="utf-8")
    assert re.search(r'pip_install "torch==2\.13\.0" \$\{TORCH_INDEX_URL:\+--index-url "\$TORCH_INDEX_URL"\}', venv)
