"""``gauge-audit groups`` and ``nullity --family`` on the new architectures: the group's total on a
small model with the same switches equals the measured nullity, factor formulas equal the theory's
family ranks, G_max's differences are flagged, bad input is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from gauge_audit.cli import main
from gauge_audit.models import deepseek
from gauge_audit.nullity.groups import factors, small, total, verify

AGREE = (
    "gpt2-tiny",
    "bert-tiny",
    "attn-tiny",
    "moe-tiny",
    "llama-tiny-gqa",
    "qwen3",
    "gemma3-tiny",
    "gemma2-tiny",
    "olmo2",
    "phi3",
    "neox",
    "deepseek",
)


def _groups(capsys, *argv):
    rc = main(["groups", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("model", AGREE)
def test_groups_verify_measured_equals_explained(model, capsys):
    rc, out = _groups(capsys, model, "--verify")
    v = out["verify"]
    print(model, v["measured_nullity"], v["explained"], v["factors"], v["other_families"])
    assert rc == 0 and v["agrees"]
    assert v["measured_nullity"] == v["explained"] == v["group_total"] + sum(v["other_families"].values())
    assert all(f["formula"] == f["rank"] for f in v["factors"])


def test_groups_explains_the_small_vocabulary_first_blocks(capsys):
    """GPT-NeoX's parallel first block and OLMo 2's raw-embedding first attention read only the
    vocab points at these sizes: their token tables carry what the group factors do not."""
    for model, fam in (("neox", "token-table-ffn"), ("olmo2", None)):
        _, out = _groups(capsys, model, "--verify")
        assert out["verify"]["agrees"], model
        if fam:
            assert out["verify"]["other_families"].get(fam, 0) > 0


@pytest.mark.parametrize("kind", ["phi3-partial", "neox", "olmo2", "qwen3"])
def test_groups_reads_checkpoint_directories(hf_family, kind, capsys):
    rc, out = _groups(capsys, str(hf_family(kind)))
    assert rc == 0 and out["total_dimension"] == sum(
        f["dim"] * (out["layers"] if f["scope"] == "every layer" else 1) for f in out["factors"]
    )
    qk = {f["name"]: f for f in out["factors"]}["QK"]
    if kind in ("phi3-partial", "neox"):
        assert "partial rotary" in qk["differs"]
    if kind in ("olmo2", "qwen3"):
        assert qk["source"] == "qk-norm-scale"


def test_gmax_column_flags_the_known_differences(capsys):
    by = {}
    for m in ("llama", "qwen3", "olmo2", "gemma2", "phi3"):
        _, out = _groups(capsys, m)
        by[m] = {f["name"]: f for f in out["factors"]}
    assert by["llama"]["QK"]["differs"] == "" and by["llama"]["VO"]["differs"] == ""
    assert "QK-norm removes GL(d_k)" in by["qwen3"]["QK"]["differs"]
    assert "QK-norm" in by["olmo2"]["QK"]["differs"] and "post-norms" in by["olmo2"]["stream"]["differs"]
    assert "post-norms" in by["gemma2"]["stream"]["differs"] and by["gemma2"]["stream"]["dim"] == 0
    assert by["llama"]["stream"]["source"] == "stream-rotation"
    _, out = _groups(capsys, "phi3")  # the default Phi-3 rotates whole heads: G_max's commutant
    assert {f["name"]: f for f in out["factors"]}["QK"]["differs"] == ""


# DeepSeek's switches: query latent or a plain W_Q, MoE after a dense layer or dense only, V3's
# sigmoid router (top-1 with norm_topk_prob: the router weights only select) or V2's softmax router
_GROUPED = dict(n_group=1, topk_group=1)
DEEPSEEK = {
    "plain-q-dense": dict(q_lora_rank=0, experts=0, top_k=0, **_GROUPED),
    "latent-dense": dict(experts=0, top_k=0, **_GROUPED),
    "plain-q-moe-only-v2": dict(q_lora_rank=0, first_dense=0, router="softmax", router_renorm=False),
    "latent-top1-bias-eps0": dict(top_k=1, attn_bias=True, out_bias=True, norm_eps=0.0, latent_eps=0.0),
}


@pytest.mark.parametrize("name", sorted(DEEPSEEK))
def test_groups_deepseek_variants_measured_equals_explained(name):
    cfg = deepseek.config(**DEEPSEEK[name])
    v = verify(cfg)
    s = v.cfg
    print(name, v.measured, v.explained, v.rows, v.others)
    # the small model keeps the switches
    assert bool(s.q_lora_rank) == bool(cfg.q_lora_rank) and s.router == cfg.router and s.top_k == min(cfg.top_k, 2)
    assert [s.moe_layer(i) for i in range(s.n_layers)] == sorted({cfg.moe_layer(i) for i in range(cfg.n_layers)})
    assert v.measured == v.explained == v.factor_total + sum(v.others.values())
    assert all(a == b > 0 for _, a, b in v.rows)
    fams = {n for n, _, _ in v.rows}
    assert ("router-offset" in fams) == (cfg.router == "softmax") and ("router-top1" in fams) == (cfg.top_k == 1)
    assert ("latent-rotation" in fams) and set(v.others) <= {"norm-scale", "stream-scale", "latent-input-scale"}


def test_groups_deepseek_gmax_column_flags_mla(capsys):
    _, out = _groups(capsys, "deepseek")
    f = {x["name"]: x for x in out["factors"]}
    assert f["QK rope"]["source"] == "mla-rope-commutant" and "shared by all 4 heads" in f["QK rope"]["differs"]
    assert "per head" in f["QK rope"]["gmax"] and f["QK rope"]["dim"] == 2  # d_rope once, not h·d_rope
    assert f["QK"]["source"] == "mla-nope-gl" and "nope part only" in f["QK"]["differs"]
    assert "O(r), not GL(r)" in f["latents"]["differs"] and f["VO"]["differs"] == ""
    assert (f["FFN"]["scope"], f["experts"]["scope"]) == ("dense layers", "MoE layers")
    assert f["FFN"]["repeats"] == f["experts"]["repeats"] == 1
    assert out["total_dimension"] == sum(x["dim"] * x["repeats"] for x in out["factors"])


def test_groups_deepseek_v3_full_size_counts():
    """DeepSeek-V3's sizes (61 layers, 3 dense): the per-layer MLA factors and the totals derived by hand."""
    cfg = deepseek.config(
        d_model=7168, n_layers=61, n_heads=128, d_head=64, q_lora_rank=1536, kv_lora_rank=512, nope_dim=128,
        v_dim=128, d_ff=18432, first_dense=3, experts=256, moe_d_ff=2048, n_shared=1, n_group=8, topk_group=4,
        top_k=8, vocab=129280,
    )  # fmt: skip
    fs = factors(cfg)
    per_layer = sum(f.dim for f in fs if f.scope == "every layer")
    assert per_layer == 1_309_696 + 2_048 + 2_097_152 + 64 + 2_097_152 == 5_506_112
    assert total(cfg, fs) == 61 * per_layer + 25_686_528 + 30_582_784 + 14_848 == 392_156_992
    assert small(cfg).n_layers == 2 and small(cfg).topk_group == 1 and small(cfg).n_group == 2


def test_groups_table_output(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # wide enough that no cell is cut, whatever the terminal
    assert main(["groups", "qwen3"]) == 0
    text = capsys.readouterr().out
    assert "total continuous dimension" in text and "qk-norm-scale" in text and "G_max" in text


@pytest.mark.parametrize("kind", ["no-such-model", "/no/such/dir", "empty-dir", "junk.gguf"])
def test_groups_bad_input_one_line(kind, tmp_path, capsys):
    arg = kind
    if kind == "empty-dir":
        arg = str(tmp_path)
    elif kind == "junk.gguf":
        (tmp_path / kind).write_text("junk")
        arg = str(tmp_path / kind)
    assert main(["groups", arg]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gauge-audit: error:")


SMALL = ["--d-model", "8", "--d-head", "4", "--d-ff", "7", "--n-ctx", "4", "--vocab", "11", "--layers", "1"]
NULLITY = {
    "qwen3": [["--n-heads", "2"], ["--n-heads", "4", "--n-kv-heads", "2", "--rotary-dim", "2"]],
    "gemma3": [["--n-heads", "2", "--n-kv-heads", "1", "--window", "3"], ["--n-heads", "2", "--untied"]],
    "gemma2": [
        ["--n-heads", "2", "--n-kv-heads", "1", "--window", "3"],
        ["--n-heads", "2", "--softcap", "20", "--final-softcap", "0", "--query-pre-attn-scalar", "8"],
    ],
    # GQA: the raw-embedding score table; ε = 0: the stream scale with the readers ×1/c (SwiGLU is
    # not homogeneous), tied: with the final norm's γ
    "olmo2": [
        ["--n-heads", "2"],
        ["--n-heads", "4", "--n-kv-heads", "2"],
        ["--n-heads", "4", "--n-kv-heads", "2", "--norm-eps", "0"],
        ["--n-heads", "2", "--norm-eps", "0", "--tied"],
    ],
    "phi3": [["--n-heads", "2", "--rotary-dim", "2"], ["--n-heads", "4", "--n-kv-heads", "2"]],
    "neox": [["--n-heads", "2"], ["--n-heads", "2", "--layers", "2"], ["--n-heads", "2", "--no-parallel-residual"]],
}


@pytest.mark.parametrize("family,extra", [(f, e) for f, es in NULLITY.items() for e in es])
def test_nullity_cli_new_families_measured_equals_explained(family, extra, capsys):
    rc = main(["nullity", "--family", family, *SMALL, *extra, "--quiet", "--json"])
    r = json.loads(capsys.readouterr().out)
    print(family, extra, r["measured_nullity"], r["explained"])
    assert rc == 0 and r["measured_nullity"] == r["explained"] and r["unexplained"] == 0


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--family", "llama", "--softcap", "30"], "is an option of --family gemma"),
        (["--family", "gemma3", "--rotary-dim", "2"], "whole head"),
        (["--family", "gemma2", "--norm-placement", "pre"], "sandwich"),
        (["--family", "bert", "--parallel-residual"], "parallel residual"),
        (["--family", "qwen3", "--window", "-1"], "--window"),
        (["--family", "gemma2", "--final-softcap", "nan"], "finite"),
        (["--family", "llama", "--tied", "--untied"], "not allowed"),
    ],
)
def test_nullity_cli_refuses_invalid_combinations(argv, needle, capsys):
    with pytest.raises(SystemExit) if "--untied" in argv and "--tied" in argv else _nothing():
        rc = main(["nullity", *argv, "--quiet"])
        assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
