"""Small CLI contracts: --version, every option's help states its default, audit --out refuses an
existing directory (as the other writing commands do) unless --force, a NaN weight gives one error
line before any output, and assert_gauge_invariant names a ``names`` key that matches nothing."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from gauge_audit import __version__
from gauge_audit.cli import SUBCOMMANDS, _subcommand, build_parser, main


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("gauge-audit has no subcommands")


def _option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text argparse prints for ``action`` (defaults expanded)."""
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"gauge-audit {__version__} ") and torch.__version__ in out


def test_every_option_help_states_its_default():
    subs = _subparsers(build_parser())
    assert len(subs) >= 9
    missing, checked = [], 0
    for name, parser in subs.items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
                continue  # positionals, flags, options without a default
            checked += 1
            text = _option_help(parser, action)
            shown = {str(action.default)} | ({f"{action.default:g}"} if isinstance(action.default, float) else set())
            if "default" not in text or not any(s in text for s in shown):
                missing.append(f"{name} {action.option_strings[0]}: {text!r} (default {action.default!r})")
    assert checked >= 20
    assert not missing, "options whose --help does not state the default:\n" + "\n".join(missing)


def test_help_renders_for_every_subcommand(capsys):
    for name in _subparsers(build_parser()):
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert "(default: " in capsys.readouterr().out or name in ("claims", "derive")


# ----------------------------------------------------------------------------- NaN weight: error first, alone
def _with_nan(src, dst):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    sd["model.layers.1.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("how", [["--action", "qk-gl"], ["--all"]])
def test_nan_weight_error_comes_first_alone(tiny_hf, tmp_path, capsys, how):
    bad = _with_nan(tiny_hf("llama"), tmp_path / "bad")
    assert main(["check", "--checkpoint", str(bad), *how]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no table header before the error
    assert err.count("\n") == 1 and err.startswith("gauge-audit: error: ") and "NaN" in err


# ----------------------------------------------------------------------------- assert_gauge_invariant names
def test_names_key_matching_no_parameter_is_named():
    from gauge_audit.testing import assert_gauge_invariant

    g = torch.Generator().manual_seed(0)
    params = {
        "v": torch.randn(2, 6, 3, generator=g, dtype=torch.float64),
        "o": torch.randn(2, 3, 6, generator=g, dtype=torch.float64),
        "v_bias": torch.randn(2, 3, generator=g, dtype=torch.float64),
    }

    def fwd(p, x):
        vals = torch.einsum("nd,hde->hne", x, p["v"]) + p["v_bias"][:, None, :]
        return torch.einsum("hne,hed->nd", vals, p["o"])

    x = torch.randn(4, 6, generator=g, dtype=torch.float64)
    rule = {
        "scope": "head",
        "elements": {"N": "GL(d_v)"},
        "maps": {"W_V": "W_V @ N", "b_V": "b_V @ N", "W_O": "inv(N) @ W_O"},
    }
    good = {"W_V": "v", "W_O": "o", "b_V": "v_bias"}
    assert assert_gauge_invariant(fwd, params, rule, inputs=x, names=good).verdict == "HOLDS"
    # b_V misspelt: before, it was taken as absent and the rule checked on W_V, W_O only (a FAILS
    # for the wrong reason, or a pass of a rule whose bias map was never exercised)
    with pytest.raises(AssertionError, match=r"no parameter matches b_V → 'v_bais' \(did you mean 'v_bias'\?\)"):
        assert_gauge_invariant(fwd, params, rule, inputs=x, names={**good, "b_V": "v_bais"})
    with pytest.raises(AssertionError, match=r"W_O → 'out'"):
        assert_gauge_invariant(fwd, params, rule, inputs=x, names={**good, "W_O": "out"})


# ----------------------------------------------------------------------------- audit --out
FAST_CLAIM = "count-wiki-log-hfact"


def test_audit_refuses_existing_out_unless_force(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["audit", "--only", FAST_CLAIM, "--out", str(out), "--quiet"]) == 2
    o, err = capsys.readouterr()
    assert o == "" and err.count("\n") == 1 and "already exists" in err and "--force" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]  # left alone
    assert main(["audit", "--only", FAST_CLAIM, "--out", str(out), "--quiet", "--force"]) == 0
    assert json.loads((out / "report.json").read_text())["claims"][0]["id"] == FAST_CLAIM
    assert not (out / "keep.txt").exists()  # replaced, not written into
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no staging or set-aside copies left
    fresh = tmp_path / "new" / "deeper"  # missing parents are made
    assert main(["audit", "--only", FAST_CLAIM, "--out", str(fresh), "--quiet"]) == 0
    assert (fresh / "report.json").is_file()
    afile = tmp_path / "file"
    afile.write_text("x")
    capsys.readouterr()
    assert main(["audit", "--only", FAST_CLAIM, "--out", str(afile), "--quiet", "--force"]) == 2
    assert "not a directory" in capsys.readouterr().err and afile.read_text() == "x"


def test_a_subcommand_imports_its_own_module_only():
    """`gauge-audit CMD` registers CMD alone (the other commands bring the audit, the nullity theory
    and SymPy: a second of every start); help and a typo still see every subcommand, and the audit
    runs with every module loaded, as its report.json has always been measured."""
    code = (
        "import sys; from gauge_audit.cli import main; "
        "rc = main(['canonicalize', '--model', 'gpt2-tiny', '--json']); "
        "print(sorted(m for m in ('sympy', 'gauge_audit.cli.audit', 'gauge_audit.nullity') if m in sys.modules)); "
        "sys.exit(rc)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]"
    p = subprocess.run(
        [sys.executable, "-c", "from gauge_audit.cli import main; main(['bogus'])"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and all(name in err[0] for name in SUBCOMMANDS)
    assert _subcommand(["check", "--model", "gpt2-tiny"]) == "check"
    assert _subcommand(["audit", "--only", "qk-gl"]) is None and _subcommand(["--help"]) is None
