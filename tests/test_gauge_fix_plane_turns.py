"""The discrete part a QK-norm leaves on each RoPE plane: a half turn of a plane's query and key
rows in one KV group, and a quarter turn with the plane's q_norm/k_norm entries exchanged, are
exact symmetries (transformers' float64 logits agree), so `compare` must see through them.

The copies are made here on the files, in transformers' layout, independently of the project's
actions; a quarter turn that forgets the norm entries is not a symmetry and must stay DIFFERENT."""

from __future__ import annotations

import json
import shutil

import pytest

from gauge_audit.cli import main
from gauge_audit.models.checkpoint import open_checkpoint
from hf_families import hf_logits, inputs, rel, tol

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")


def turned(src, out, kind: str, group: int = 0, swap_norms: bool = True):
    """A copy of ``src`` with layer 0's first rotary plane (0, e/2) turned: ``half`` in KV group
    ``group``; ``quarter`` in every group a shared norm reaches (the full-width norm: one group)."""
    cfg = json.loads((src / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    n, g = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    e = cfg.get("head_dim") or cfg["hidden_size"] // n
    t = safetensors.load_file(str(src / "model.safetensors"))
    pre = next(k for k in t if k.endswith("layers.0.self_attn.q_proj.weight")).rsplit(".q_proj.weight", 1)[0]
    wq, wk = t[f"{pre}.q_proj.weight"].clone(), t[f"{pre}.k_proj.weight"].clone()
    qn, kn = t[f"{pre}.q_norm.weight"].clone(), t[f"{pre}.k_norm.weight"].clone()
    full = qn.numel() == n * e
    a, b = 0, e // 2
    groups = [group % g] if kind == "half" or full else list(range(g))

    def turn(w, row):
        x, y = w[row + a].clone(), w[row + b].clone()
        w[row + a], w[row + b] = (-x, -y) if kind == "half" else (-y, x)

    for j in groups:
        for h in range(j * (n // g), (j + 1) * (n // g)):
            turn(wq, h * e)
        turn(wk, j * e)
        if kind == "quarter" and swap_norms and (full or j == groups[0]):  # a shared norm: once
            for w, starts in (
                (qn, [h * e for h in range(j * (n // g), (j + 1) * (n // g))] if full else [0]),
                (kn, [j * e] if full else [0]),
            ):
                for s in starts:
                    w[[s + a, s + b]] = w[[s + b, s + a]].clone()
    t.update(
        {f"{pre}.q_proj.weight": wq, f"{pre}.k_proj.weight": wk, f"{pre}.q_norm.weight": qn, f"{pre}.k_norm.weight": kn}
    )
    shutil.copytree(src, out)
    safetensors.save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("kind", ["qwen3", "olmo2", "gemma3"])
@pytest.mark.parametrize("turn", ["half", "quarter"])
def test_compare_sees_through_plane_turns(hf_family, tiny_hf, kind, turn, tmp_path, capsys):
    src = (tiny_hf if kind.startswith("gemma") else hf_family)(kind)
    out = turned(src, tmp_path / "turned", turn, group=-1 if turn == "half" else 0)
    ckpt = open_checkpoint(src)
    x = inputs(ckpt.cfg)
    # the copy is the same function: transformers' float64 logits, against the project's tolerance
    assert rel(hf_logits(out, ckpt, x, True), hf_logits(src, ckpt, x, True)) <= tol(ckpt.cfg, x["tokens"].shape[1])
    assert main(["compare", str(src), str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["verdict"] == "EQUIVALENT", r
    assert r["invariant_distance"] <= r["tolerance"]


@pytest.mark.parametrize("kind", ["qwen3", "olmo2"])
def test_a_quarter_turn_without_its_norm_entries_is_different(hf_family, kind, tmp_path, capsys):
    src = hf_family(kind)
    out = turned(src, tmp_path / "turned", "quarter", swap_norms=False)
    ckpt = open_checkpoint(src)
    x = inputs(ckpt.cfg)
    assert rel(hf_logits(out, ckpt, x, True), hf_logits(src, ckpt, x, True)) > 1e6 * tol(ckpt.cfg, x["tokens"].shape[1])
    main(["compare", str(src), str(out), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["verdict"] == "DIFFERENT" and r["invariant_distance"] > 1e4 * r["tolerance"], r
