"""A tensor group whose compare tolerance reaches the distance between independent models cannot
vouch for EQUIVALENT.  GPT-NeoX with a vocabulary (12) below d_model (32): block 0 reads the stream
at finitely many points, several families are left unfixed, and the rounding response of the
canonical form is O(1) in most groups — there a gauge copy is UNDECIDED, never EQUIVALENT, and an
independent model is not EQUIVALENT either."""

from __future__ import annotations

import json

import pytest
import transformers

from gauge_audit.cli import main
from gauge_audit.gauge_fix.comparison import VOUCH_LIMIT
from hf_families import KINDS, randomize

pytest.importorskip("transformers")


def _neox(path, seed: int):
    conf, arch, kw = KINDS["neox"]
    m = getattr(transformers, arch)(getattr(transformers, conf)(**dict(kw, vocab_size=12))).eval()
    randomize(m, seed)
    m.save_pretrained(str(path))
    return path


def test_a_group_that_cannot_vouch_makes_the_verdict_undecided(tmp_path, capsys):
    a, b = _neox(tmp_path / "a", 0), _neox(tmp_path / "b", 1)
    copy = tmp_path / "copy"
    assert main(["transform", "--checkpoint", str(a), "--action", "vo-gl", "--seed", "1", "--out", str(copy)]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(copy), "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    vague = {g for g, v in r["groups"].items() if v["undecided"]}
    assert r["verdict"] == "UNDECIDED" and vague, r
    assert all(r["groups"][g]["tolerance"] >= VOUCH_LIMIT for g in vague)
    assert main(["compare", str(a), str(b), "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["verdict"] in ("UNDECIDED", "DIFFERENT"), r
