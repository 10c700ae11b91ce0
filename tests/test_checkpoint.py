"""Hugging Face checkpoints in and out: the loader against transformers' own forward for every
supported architecture (float64, derived tolerance), block-by-block processing equal to the
in-memory rule, the transform round trip per family, refused options and bad inputs."""

from __future__ import annotations

import json
import math
import shutil
import struct

import pytest
import torch

from gauge_audit.actions import ACTIONS, get_action
from gauge_audit.actions.blockwise import apply_blockwise
from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models import NAMED, build
from gauge_audit.models.checkpoint import open_checkpoint
from gauge_audit.models.registry import FAMILIES, Model
from gauge_audit.numeric import check, tolerance

transformers = pytest.importorskip("transformers")
from gauge_audit.reference import Reference, checkpoint_tensors, float64_internals, hf_kwargs  # noqa: E402

EPS64, EPS32 = torch.finfo(torch.float64).eps, torch.finfo(torch.float32).eps
KINDS = ["gpt2", "gpt2-untied", "gpt2-bare", "bert", "llama", "llama-bias-tied", "mistral", "qwen", "mixtral"]
LLAMA_LIKE = {"llama", "llama-bias-tied", "mistral", "qwen", "mixtral"}  # transformers computes parts in float32


def _inputs(cfg, seed=0, batch=3, n=12):
    g = torch.Generator().manual_seed(seed)
    x = {"tokens": torch.randint(0, cfg.vocab, (batch, n), generator=g)}
    if cfg.n_types:
        x["token_types"] = torch.randint(0, cfg.n_types, (batch, n), generator=g)
    return x


def _hf_forward(model, cfg, x):
    kw = {"input_ids": x["tokens"], "attention_mask": torch.ones_like(x["tokens"])}
    if "token_types" in x:
        kw["token_type_ids"] = x["token_types"]
    with torch.no_grad():
        out = model(**kw)
    return (out.logits if cfg.unembed else out.last_hidden_state).to(torch.float64)


def _auto(ckpt):
    return getattr(transformers, ckpt.arch.auto)


def _from_pretrained(path, ckpt, exact=True):
    """transformers' own loader and model in float64 (exact: its float32 internals in float64)."""
    m = (
        _auto(ckpt)
        .from_pretrained(str(path), dtype=torch.float64, attn_implementation="sdpa", **hf_kwargs(ckpt.cfg))
        .eval()
    )
    if exact:
        float64_internals(m)
    return m


def _tol(cfg, n, kappa=1.0, dtype=torch.float64):
    return tolerance(Model("x", cfg, {}, FAMILIES[cfg.family]), kappa, dtype, n)[0]


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


# ----------------------------------------------------------------------------- the loader vs transformers
@pytest.mark.parametrize("kind", KINDS)
def test_loader_matches_transformers_float64(tiny_hf, kind):
    path = tiny_hf(kind)
    ckpt = open_checkpoint(path)
    model = ckpt.model()
    x = _inputs(ckpt.cfg)
    ours = model.forward(model.params, x)
    want = _hf_forward(_from_pretrained(path, ckpt), ckpt.cfg, x)
    err, tol = _rel(ours, want), _tol(ckpt.cfg, x["tokens"].shape[1])
    print(
        f"{kind}: project vs transformers (float64 internals) {err / EPS64:.2f} ε64, tol L·K·ε = {tol / EPS64:.0f} ε64"
    )
    assert err <= tol
    # transformers exactly as shipped: LLaMA-family RMSNorm, RoPE angles and the Mixtral router run in
    # float32 inside the float64 model, so its own rounding is L·K·ε32 there.
    shipped = _hf_forward(
        _auto(ckpt).from_pretrained(str(path), dtype=torch.float64, **hf_kwargs(ckpt.cfg)).eval(), ckpt.cfg, x
    )
    e_shipped = _rel(ours, shipped)
    tol_shipped = _tol(ckpt.cfg, x["tokens"].shape[1], dtype=torch.float32 if kind in LLAMA_LIKE else torch.float64)
    print(
        f"{kind}: project vs transformers as shipped {e_shipped / EPS64:.3g} ε64 = {e_shipped / EPS32:.3g} ε32, "
        f"tol {tol_shipped / EPS64:.3g} ε64"
    )
    assert e_shipped <= tol_shipped


@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama", "mixtral"])
def test_a_wrong_mapping_fails_by_a_wide_margin(tiny_hf, kind):
    """Two query heads swapped (a head-order mistake in the mapping): far outside the tolerance."""
    path = tiny_hf(kind)
    ckpt = open_checkpoint(path)
    p = dict(ckpt.params())
    wq = p["blocks.0.attn.W_Q"].clone()
    p["blocks.0.attn.W_Q"] = wq[[1, 0, *range(2, wq.shape[0])]]
    x = _inputs(ckpt.cfg)
    model = ckpt.model()
    err = _rel(model.forward(p, x), _hf_forward(_from_pretrained(path, ckpt), ckpt.cfg, x))
    tol = _tol(ckpt.cfg, x["tokens"].shape[1])
    print(f"{kind} with two query heads swapped: {err:.3g} relative vs tol {tol:.3g}")
    assert err > 1e6 * tol


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_reference_equals_from_pretrained(tiny_hf, kind):
    """The layer-streamed transformers model (meta layers loaded by hooks) computes what
    from_pretrained computes, Mixtral's fused experts included."""
    path = tiny_hf(kind)
    ckpt = open_checkpoint(path)
    x = _inputs(ckpt.cfg)
    streamed = Reference(ckpt.arch, ckpt.hf_config, ckpt.cfg).forward(checkpoint_tensors(ckpt), x)
    full = _hf_forward(_from_pretrained(path, ckpt), ckpt.cfg, x)
    err = _rel(streamed, full)
    print(f"{kind}: streamed reference vs from_pretrained {err / EPS64:.2f} ε64")
    assert err <= _tol(ckpt.cfg, x["tokens"].shape[1])
    # through the project layout (the GGUF path) the same tensors come back
    via_layout = Reference(ckpt.arch, ckpt.hf_config, ckpt.cfg).forward(
        checkpoint_tensors(ckpt, params=ckpt.params()), x
    )
    assert torch.equal(via_layout, streamed)


def test_sharded_checkpoint_reads_the_same_tensors(tiny_hf):
    one, sharded = open_checkpoint(tiny_hf("qwen")), open_checkpoint(tiny_hf("qwen", shard=True))
    assert (tiny_hf("qwen", shard=True) / "model.safetensors.index.json").is_file()
    assert len({w.path for w in sharded.source.where.values()}) > 1
    a, b = one.params(), sharded.params()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_mixtral_fused_expert_layout_is_read(tiny_hf, tmp_path):
    """transformers ≥ 5 keeps experts fused in memory (gate_up_proj, down_proj); a checkpoint saved in
    that layout reads to the same parameters as the per-expert files."""
    from safetensors.torch import save_file

    src = tiny_hf("mixtral")
    model = transformers.MixtralForCausalLM.from_pretrained(str(src), experts_implementation="eager")
    shutil.copy(src / "config.json", tmp_path / "config.json")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    a, b = open_checkpoint(src).params(), open_checkpoint(tmp_path).params()
    assert any("gate_up_proj" in n for n in open_checkpoint(tmp_path).source.entries)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unprefixed_gpt2_lm_head_checkpoint_reads_the_same(tiny_hf, tmp_path):
    """The original gpt2 upload stores the decoder without the "transformer." prefix (and old causal-mask
    buffers): same parameters, and the written copy uses the prefix transformers writes."""
    from safetensors.torch import load_file, save_file

    src = tiny_hf("gpt2")
    shutil.copy(src / "config.json", tmp_path / "config.json")
    sd = {k.removeprefix("transformer."): v for k, v in load_file(str(src / "model.safetensors")).items()}
    sd["h.0.attn.bias"] = torch.ones(1, 1, 24, 24).tril()
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    a, b = open_checkpoint(src).params(), open_checkpoint(tmp_path).params()
    assert all(torch.equal(a[k], b[k]) for k in a)
    from gauge_audit.models.checkpoint.writer import plan

    assert all(
        n.startswith("transformer.") for n in plan(open_checkpoint(tmp_path), open_checkpoint(tmp_path).cfg, None)
    )


def test_transform_with_an_element_file_records_its_hash(tiny_hf, tmp_path):
    import hashlib

    import numpy as np

    from gauge_audit.transform import transform

    src = tiny_hf("qwen")
    cfg = open_checkpoint(src).cfg
    s = 0.5 + torch.rand(cfg.n_layers, cfg.d_ff, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    np.savez(tmp_path / "s.npz", s=s.numpy())
    cert = transform(src, "swiglu-scaling", tmp_path / "out", element=str(tmp_path / "s.npz"))
    assert cert.verdict == "HOLDS" and cert.max_rel_change < 1e3 * torch.finfo(torch.float32).eps
    assert cert.element["sha256"] == hashlib.sha256((tmp_path / "s.npz").read_bytes()).hexdigest()


def test_minilm_package_reads_as_a_bert_checkpoint():
    from gauge_audit.models import minilm

    ckpt = minilm.checkpoint()
    assert ckpt.arch.name == "BertModel" and ckpt.cfg.d_model == 384 and ckpt.cfg.n_layers == 6
    assert ckpt.passthrough() and all(n.startswith("pooler.") for n in ckpt.passthrough())


# ----------------------------------------------------------------------------- block by block
def test_blockwise_equals_whole_model_rule_for_every_action():
    count = 0
    for name in NAMED:
        m = build(name, device="cpu")
        for a in ACTIONS.values():
            if a.applies(m.cfg):
                continue
            el = a.sample(m.cfg, m.params, torch.Generator().manual_seed(1), 10.0)
            full, blocks = a.apply(m.cfg, m.params, el), apply_blockwise(a, m.cfg, m.params, el)
            assert set(full) == set(blocks)
            assert all(torch.equal(full[k], blocks[k]) for k in full), (name, a.name)
            count += 1
    assert count > 100


@pytest.mark.parametrize(
    "kind,action",
    [
        ("llama", "stream-rotation"),
        ("gpt2-untied", "stream-rotation"),
        ("mixtral", "expert-perm"),
        ("bert", "value-bias-fold"),
    ],
)
def test_lazy_check_equals_in_memory_check(tiny_hf, kind, action):
    ckpt = open_checkpoint(tiny_hf(kind))
    lazy = ckpt.model(name="x")
    memory = Model("x", ckpt.cfg, dict(ckpt.params()), FAMILIES[ckpt.cfg.family])
    a, b = check(lazy, action, seed=3).to_json(), check(memory, action, seed=3).to_json()
    assert a == b and a["verdict"] == "HOLDS"


def test_lazy_params_hold_one_block(tiny_hf):
    """The transformed mapping keeps a single block: asking for block 1 drops block 0."""
    from gauge_audit.actions.blockwise import transformed

    ckpt = open_checkpoint(tiny_hf("llama"))
    act = get_action("qk-gl")
    p = ckpt.params()
    new = transformed(act, ckpt.cfg, p, act.sample(ckpt.cfg, p, torch.Generator().manual_seed(0), 10.0))
    new["blocks.0.attn.W_Q"]
    assert new._block[0] == 0
    new["blocks.1.attn.W_Q"]
    assert new._block[0] == 1 and all(k.startswith("blocks.1.") for k in new._block[1])


# ----------------------------------------------------------------------------- check --checkpoint
def test_check_checkpoint_all_json(tiny_hf, capsys):
    path = tiny_hf("qwen")
    assert main(["check", "--checkpoint", str(path), "--all", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    applicable = {a.name for a in ACTIONS.values() if a.applies(open_checkpoint(path).cfg) is None}
    assert {r["action"] for r in rows} == applicable
    for r in rows:
        assert {"model", "action", "verdict", "max_rel_error", "residual_eps", "tolerance_eps"} <= set(r)
        assert r["verdict"] == r["expected"]
        assert r["extra"]["next_token_unchanged"] == (r["verdict"] == "HOLDS") or r["verdict"] == "FAILS"


def test_check_checkpoint_table_and_element(tiny_hf, tmp_path, capsys):
    import numpy as np

    path = tiny_hf("llama")
    cfg = open_checkpoint(path).cfg
    q = torch.linalg.qr(torch.randn(cfg.n_layers, cfg.n_kv_heads, cfg.d_head, cfg.d_head, dtype=torch.float64)).Q
    np.savez(tmp_path / "n.npz", N=q.numpy())
    assert (
        main(
            [
                "check",
                "--checkpoint",
                str(path),
                "--action",
                "vo-gl",
                "--element",
                str(tmp_path / "n.npz"),
                "--dtype",
                "float32",
                "--seed",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "vo-gl" in out and "HOLDS" in out and "next token unchanged" in out


def test_check_text_needs_a_tokenizer(tiny_hf, capsys):
    assert main(["check", "--checkpoint", str(tiny_hf("llama")), "--action", "qk-gl", "--text", "hi"]) == 2
    assert "tokenizer" in capsys.readouterr().err


# ----------------------------------------------------------------------------- transform round trips
ROUND_TRIPS = [
    ("gpt2", "qk-gl", []),
    ("gpt2-untied", "stream-rotation", []),
    ("gpt2-bare", "vo-gl", []),
    ("bert", "value-bias-fold", []),
    ("llama", "stream-rotation", []),
    ("llama-bias-tied", "stream-rotation", ["--untie"]),
    ("mistral", "swiglu-scaling", []),
    ("qwen", "head-perm", []),
    ("mixtral", "expert-perm", []),
]


@pytest.mark.parametrize("kind,action,extra", ROUND_TRIPS, ids=[f"{k}-{a}" for k, a, _ in ROUND_TRIPS])
def test_transform_round_trip(tiny_hf, tmp_path, capsys, kind, action, extra):
    src = tiny_hf(kind)
    out = tmp_path / "out"
    assert (
        main(
            [
                "transform",
                "--checkpoint",
                str(src),
                "--action",
                action,
                "--out",
                str(out),
                "--seed",
                "1",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    cert = json.loads(capsys.readouterr().out)
    assert cert["verdict"] == "HOLDS" and (out / "certificate.json").is_file()
    assert json.loads((out / "certificate.json").read_text())["max_rel_change"] == cert["max_rel_change"]
    ckpt = open_checkpoint(src)
    model, info = _auto(ckpt).from_pretrained(
        str(out), dtype=torch.float64, output_loading_info=True, **hf_kwargs(ckpt.cfg)
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    float64_internals(model)
    x = {k: torch.tensor(v) for k, v in cert["inputs"].items()}
    after = _hf_forward(model.eval(), ckpt.cfg, x)
    before = _hf_forward(_from_pretrained(src, ckpt), ckpt.cfg, x)
    err = _rel(after, before)
    # the written weights are float32: tol = κ·L·K·ε32
    tol = _tol(ckpt.cfg, x["tokens"].shape[1], cert["kappa"], torch.float32)
    print(
        f"{kind} {action}: transformers' logits change {err / EPS32:.3g} ε32 (certificate "
        f"{cert['residual_eps']:.3g}), tol {tol / EPS32:.3g} ε32"
    )
    assert err <= tol and cert["tolerance"] == pytest.approx(tol)
    assert abs(err - cert["max_rel_change"]) <= 4 * EPS64 * 1e3 or err == pytest.approx(
        cert["max_rel_change"], rel=1e-6
    )
    # ... and the weights really changed
    old = _from_pretrained(src, ckpt).state_dict()
    new = model.state_dict()
    assert max(float((new[k] - old[k]).abs().max()) for k in old if k in new and new[k].shape == old[k].shape) > 1e-3
    if "--untie" in extra:
        assert cert["untied"]["added_parameters"] == ckpt.cfg.vocab * ckpt.cfg.d_model
        assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False


def test_transform_keeps_bfloat16_storage_and_derives_its_tolerance(tiny_hf, tmp_path):
    from gauge_audit.transform import transform

    src = tiny_hf("llama", dtype=torch.bfloat16)
    assert open_checkpoint(src).storage_dtype == torch.bfloat16
    cert = transform(src, "qk-gl", tmp_path / "o", seed=0, kappa=1.0)
    eps_bf16 = torch.finfo(torch.bfloat16).eps
    assert cert.dtype == "bfloat16" and cert.verdict == "HOLDS"
    assert cert.tolerance == pytest.approx(_tol(open_checkpoint(src).cfg, 16, cert.kappa, torch.bfloat16))
    assert cert.residual_eps == pytest.approx(cert.max_rel_change / eps_bf16)
    cert64 = transform(src, "qk-gl", tmp_path / "o64", seed=0, kappa=1.0, dtype=torch.float64)
    assert cert64.dtype == "float64" and cert64.verdict == "HOLDS" and cert64.max_rel_change < 1e-12


@pytest.mark.parametrize(
    "kind,action,match",
    [
        ("gpt2", "stream-rotation", "tied"),
        ("gpt2-bare", "stream-rotation", "final norm's output"),
        ("bert", "norm-scale", "post-LN"),
        ("llama", "qk-same-action", "false rule"),
        ("llama", "relu-scaling", "activation"),
    ],
)
def test_transform_refuses_actions_without_a_rule(tiny_hf, tmp_path, capsys, kind, action, match):
    out = tmp_path / "out"
    assert main(["transform", "--checkpoint", str(tiny_hf(kind)), "--action", action, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and not out.exists()
    if match == "tied":
        assert "--untie" in err


# ----------------------------------------------------------------------------- refused options
def _edited(src, tmp_path, **changes):
    dst = tmp_path / "edited"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    "kind,changes,match",
    [
        ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0}}, "rope_type"),
        ("llama", {"rope_parameters": None, "rope_scaling": {"type": "su", "factor": 2.0}}, "rope_scaling"),
        ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0}}, "original_max"),
        ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act"),
        ("llama", {"alibi": True}, "alibi"),
        ("llama", {"use_parallel_residual": True}, "use_parallel_residual"),
        ("llama", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ("mistral", {"sliding_window": 0}, "sliding_window"),
        ("qwen", {"use_sliding_window": True, "sliding_window": 8}, "sliding_window"),
        ("mixtral", {"sliding_window": -3}, "sliding_window"),
        ("gpt2", {"activation_function": "gelu_fast"}, "activation_function"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("gpt2", {"add_cross_attention": True}, "add_cross_attention"),
        ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ("llama", {"architectures": ["FalconForCausalLM"]}, "unknown architecture"),
        ("llama", {"hidden_size": 20}, "shape mismatch"),
        ("llama", {"vocab_size": 41}, "shape mismatch"),
        ("llama", {"num_hidden_layers": 3}, "the weights hold 2"),
        ("llama", {"num_hidden_layers": 1}, "the weights hold 2"),
    ],
)
def test_unrepresentable_options_are_refused_in_one_line(tiny_hf, tmp_path, capsys, kind, changes, match):
    path = _edited(tiny_hf(kind), tmp_path, **changes)
    with pytest.raises(GaugeAuditError, match=match):
        open_checkpoint(path)
    capsys.readouterr()  # only what the CLI prints below is under test
    assert main(["check", "--checkpoint", str(path), "--action", "qk-gl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


# ----------------------------------------------------------------------------- bad input
def _header(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw, n, json.loads(raw[8 : 8 + n])


def _bad_nan(src, tmp_path):
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    sd["model.layers.1.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _bad_truncated(src, tmp_path):
    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return dst


def _bad_lying_header(src, tmp_path):
    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    raw, n, header = _header(dst / "model.safetensors")
    header["model.norm.weight"]["shape"] = [1000]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (dst / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    return dst


def _bad_no_weights(src, tmp_path):
    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()
    return dst


def _bad_missing(src, tmp_path):
    return tmp_path / "does-not-exist"


def _bad_garbage_json(src, tmp_path):
    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    (dst / "config.json").write_text("{not json")
    return dst


BAD = {
    "missing": (_bad_missing, "no such checkpoint"),
    "no-weights": (_bad_no_weights, "no model.safetensors"),
    "truncated": (_bad_truncated, "truncated"),
    "lying-header": (_bad_lying_header, "needs"),
    "nan": (_bad_nan, "NaN"),
    "bad-json": (_bad_garbage_json, "not valid JSON"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_input_one_line_exit_2_nothing_written(tiny_hf, tmp_path, capsys, bad):
    make, match = BAD[bad]
    path = make(tiny_hf("llama"), tmp_path)
    assert main(["check", "--checkpoint", str(path), "--action", "qk-gl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "Traceback" not in err
    out = tmp_path / "out"
    assert main(["transform", "--checkpoint", str(path), "--action", "qk-gl", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_existing_out_is_refused_and_left_alone(tiny_hf, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["transform", "--checkpoint", str(tiny_hf("llama")), "--action", "qk-gl", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_safetensors_writer_round_trip(tmp_path):
    from safetensors.torch import load_file

    from gauge_audit.models.checkpoint.safetensors_file import SafetensorsWriter, read_header

    tensors = {
        "b": torch.randn(3, 5, dtype=torch.float64),
        "a": torch.randn(7).to(torch.bfloat16),
        "c": torch.arange(6, dtype=torch.float32).reshape(2, 3),
    }
    path = tmp_path / "x.safetensors"
    with SafetensorsWriter(path, {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}) as w:
        for k in ("c", "a", "b"):  # any order
            w.write(k, tensors[k])
    back = load_file(str(path))
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert set(read_header(path)) == set(tensors)
    with pytest.raises(GaugeAuditError, match="never written"):
        with SafetensorsWriter(tmp_path / "y.safetensors", {"a": (torch.float32, (2,))}):
            pass
    assert math.isfinite(float(back["b"].sum()))
