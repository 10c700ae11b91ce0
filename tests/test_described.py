"""The reference families described per tensor (models/described.py): the candidate families of a
derived architecture, tested on the family's own forward, explain the whole measured nullity — the
same nullity the hand-written theory measures and explains — and what a description cannot state
is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models.architectures import ARCHITECTURES
from gauge_audit.models.described import description, generic_model, per_head, rows
from gauge_audit.models.families import family_of, param_shapes
from gauge_audit.models.params import init_params
from gauge_audit.nullity.analysis import analyze
from gauge_audit.nullity.found import SEQ, measure
from gauge_audit.nullity.groups import described_small, small, verify_described

REFUSED = {"bert", "attn"}
DESCRIBED = sorted(set(ARCHITECTURES) - REFUSED)


def _small(name: str, **over):
    """The small model of ``groups --verify`` as its description measures it."""
    return described_small(ARCHITECTURES[name].config(**over))


@pytest.mark.parametrize("name", DESCRIBED)
def test_rows_are_the_same_tensors_and_the_same_function(name):
    """The row layout is a reshape: back and forth is exact, and the model computes its family's forward."""
    cfg = _small(name)
    native = init_params(param_shapes(cfg), 3, torch.device("cpu"), torch.float64)
    back = per_head(cfg, rows(native))
    assert all(torch.equal(back[k], native[k]) for k in native)
    ids = torch.randint(0, cfg.vocab, (2, SEQ), generator=torch.Generator().manual_seed(1))
    m = generic_model(cfg, 3)
    y = family_of(cfg).forward(native, cfg, {"tokens": ids})
    assert torch.equal(m.logits(m.params, ids), y)


@pytest.mark.parametrize(
    "name, over",
    [(n, {}) for n in DESCRIBED]
    + [
        ("gpt2", {"tied": True}),
        ("gpt2", {"norm": "layernorm-noaffine", "act": "relu"}),
        ("gpt2", {"pos": "none", "unembed_bias": True}),
        ("llama", {"norm": "rmsnorm-noweight", "n_kv_heads": 1}),
        ("llama", {"rotary_dim": 2, "d_head": 6, "tied": True}),
        ("llama", {"norm": "none"}),
        ("qwen", {"mlp_bias": True, "out_bias": True}),
        ("moe", {"mlp_bias": True, "router_renorm": False}),
        ("olmo2", {"qk_norm": "head"}),
        ("neox", {"vocab": 40}),
        ("neox", {"parallel_residual": False}),
        ("gemma2", {"n_layers": 2}),
        ("deepseek", {"router": "softmax", "router_renorm": False, "q_lora_rank": 0}),
        ("deepseek", {"attn_bias": True, "out_bias": True}),
    ],
)
def test_description_explains_what_the_theory_explains(name, over):
    """Measured through the description (every candidate tested for flatness on the family's own
    forward) = explained, and both equal the hand-written theory's measured and explained nullity
    at the same point."""
    cfg = _small(name, **over)
    found = measure(generic_model(cfg, 0), description(cfg), 0)
    theory = analyze(cfg, seed=0, quiet=True)
    assert found.converged and not found.unexplained, found.unexplained[:3]
    assert found.nullity == found.explained == theory.measured_nullity == theory.explained


def test_a_description_missing_a_family_leaves_its_directions_unexplained():
    """The check can fail: without the learned positions among the input tables the embedding
    offset (a vector moved from the token table to the position table) is not proposed, and its
    d − 1 directions off the ones vector (that one is LayerNorm's writer-ones shift) are reported
    unexplained, moving exactly those two tables."""
    cfg = _small("gpt2")
    desc = description(cfg)
    desc.tables = desc.tables[:1]
    found = measure(generic_model(cfg, 0), desc, 0)
    assert found.nullity - found.explained == cfg.d_model - 1
    # (the complement of the explained span is orthogonal to it, so a share leaks onto the tensors
    # of the families it overlaps; most of each direction is on the two tables)
    assert all(u.get("embed.W_E", 0) + u.get("embed.W_pos", 0) > 0.9 for u in found.unexplained)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_a_description_cannot_state_is_one_line(name):
    with pytest.raises(GaugeAuditError) as e:
        description(small(ARCHITECTURES[name].config()))
    assert "\n" not in str(e.value) and "no per-tensor description" in str(e.value)
    assert isinstance(verify_described(ARCHITECTURES[name].config()), str)


def test_interleaved_rotary_planes_are_refused():
    interleaved = small(ARCHITECTURES["llama"].config()).with_(rope_style="interleaved")
    with pytest.raises(GaugeAuditError, match="interleaved"):
        description(interleaved)


def test_special_vocabulary_is_recognised_and_avoided():
    """NeoX's parallel first block at 11 tokens reads a table too small to fix its FFN: the
    description names the special size, and the verification measures at the safe one."""
    cfg = small(ARCHITECTURES["neox"].config())
    desc = description(cfg)
    special = desc.special_vocabulary(generic_model(cfg, 0).params)
    assert special is not None and special.safe > cfg.vocab
    v = verify_described(ARCHITECTURES["neox"].config())
    assert not isinstance(v, str) and v.cfg.vocab == special.safe and v.agrees


@pytest.mark.parametrize("name", ["olmo2", "moe"])
def test_groups_verify_reports_the_described_measurement(name, capsys):
    assert main(["groups", name, "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["verify"]
    d = out["described"]
    assert d["agrees"] and d["measured_nullity"] == d["explained"] and out["agrees"]
    assert d["flat"]["vo-gl"] > 0 and (name != "moe" or d["discrete"]["expert-swap"])
    assert main(["groups", "bert", "--verify", "--json"]) == 0
    assert "no per-tensor description" in json.loads(capsys.readouterr().out)["verify"]["described"]["refused"]
