"""Progress bars: drawn on stderr when it is a terminal, never under --json and never when
stderr is a pipe or a file; stdout is the same either way.  The terminal runs are fresh processes
with stderr on a pseudo-terminal; the run without a terminal is in this process, with stdout and stderr
on files (the bar asks ``isatty()``, which a pipe and a file answer alike)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

MAIN = "import sys; from gauge_audit.cli import main; sys.exit(main(sys.argv[1:]))"


def _run(argv):
    """Run the CLI in a fresh process with stdout on a pipe and stderr on a pseudo-terminal."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    p = subprocess.Popen([sys.executable, "-c", MAIN, *argv], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = p.stdout.read().decode()
    p.wait(timeout=600)
    os.close(master)
    return p.returncode, out, err.decode(errors="replace")


def _run_on_files(argv, capfd):
    """Run the CLI in this process with stdout and stderr on files (pytest's capture of file
    descriptors 1 and 2): stderr is no terminal."""
    from gauge_audit.cli import main

    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def _has_bar(err: str, desc: str) -> bool:
    return desc in err and "%|" in err  # tqdm's "desc:  40%|████      | 2/5 [...]"


@pytest.mark.parametrize(
    "argv, desc",
    [
        (["check", "--model", "attn-tiny"], "check"),
        (
            [
                "nullity",
                "--family",
                "attn",
                "--d-model",
                "4",
                "--n-heads",
                "2",
                "--d-head",
                "2",
                "--n-ctx",
                "3",
                "--layers",
                "1",
            ],
            "Jacobian rows",
        ),
        (["audit", "--only", "hg-savings,count-wiki-log-hfact", "--out", "{tmp}", "--force"], "audit"),  # three runs
    ],
)
def test_bar_on_a_terminal_only_and_never_with_json(tmp_path, capfd, argv, desc):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = _run(argv)
    assert code == 0 and _has_bar(err, desc), err[-2000:]
    code_p, out_p, err_p = _run_on_files(argv, capfd)
    assert code_p == 0 and "%|" not in err_p and err_p.strip() == "", err_p
    assert out_p.strip().splitlines()[0] == out.strip().splitlines()[0]  # stdout unchanged by the bar
    code_j, out_j, err_j = _run(argv + ["--json"])
    assert code_j == 0 and "%|" not in err_j, err_j
    text = out_j.strip()
    if argv[0] == "check":
        assert all(json.loads(line)["verdict"] for line in text.splitlines())
    else:
        assert isinstance(json.loads(text), dict)
