"""GGUF llama checkpoints and the real SmolLM2-135M-Instruct weights: dequantized, with llama.cpp's
Q/K row permutation undone, equal in float64 to transformers' LlamaForCausalLM built from the same
config and state dict; not undoing the permutation fails by a wide margin; check, --text and a
transform round trip on the real model; bad GGUF files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models import gemma3, smollm2
from gauge_audit.models.checkpoint import Checkpoint, open_checkpoint
from gauge_audit.models.checkpoint import gguf as gguf_io
from gauge_audit.models.registry import FAMILIES, Model
from gauge_audit.numeric import tolerance

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from gauge_audit.reference import checkpoint_tensors, float64_internals  # noqa: E402

EPS64, EPS32 = torch.finfo(torch.float64).eps, torch.finfo(torch.float32).eps
Q8 = gguf.GGMLQuantizationType.Q8_0


class Reference(gguf.GGUFReader):
    """gguf's own reader, its file mapped as a plain ndarray rather than an np.memmap: the same
    parser reading the same bytes (what it reads is gguf's, field by field and tensor by tensor:
    test below), but slicing a memmap builds a memmap object per slice, and the header's
    vocabulary (Gemma 3: 262 144 strings, four slices each) took 10.4 s to parse that way, 3.0 s
    this way."""

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, mapped):
        self._data = mapped.view(np.ndarray)


def _read_alike(a, b) -> None:
    assert list(a.fields) == list(b.fields)
    for k in a.fields:
        fa, fb = a.fields[k], b.fields[k]
        assert fa.types == fb.types and fa.data == fb.data and len(fa.parts) == len(fb.parts), k
        assert [x.dtype for x in fa.parts] == [y.dtype for y in fb.parts], k
        assert b"".join(x.tobytes() for x in fa.parts) == b"".join(y.tobytes() for y in fb.parts), k
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for x, y in zip(a.tensors, b.tensors):
        assert (x.tensor_type, x.data_offset, x.n_elements) == (y.tensor_type, y.data_offset, y.n_elements), x.name
        assert np.array_equal(x.shape, y.shape) and np.array_equal(x.data, y.data), x.name


def _tol(cfg, n, dtype=torch.float64):
    return tolerance(Model("x", cfg, {}, FAMILIES[cfg.family]), 1.0, dtype, n)[0]


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, copied here independently of the loader."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _reference(hf: dict, tensors, exact=True):
    """LlamaForCausalLM built from a config dict and a state dict, float64."""
    from gauge_audit.reference import hf_config, uninitialised

    model = uninitialised(
        transformers.LlamaForCausalLM, hf_config(hf), dtype=torch.float64, attn_implementation="sdpa"
    ).eval()
    names = [n for n, _ in model.state_dict().items()]
    missing, unexpected = model.load_state_dict({n: tensors(n) for n in names if n in tensors.keys()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if exact:
        float64_internals(model)
    return model


class _Dict(dict):
    def __call__(self, name):
        return self[name]


def _logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.to(torch.float64)


# ----------------------------------------------------------------------------- a tiny GGUF
TINY = dict(d=64, heads=4, kv=2, e=16, ff=128, vocab=96, layers=2)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A llama GGUF written the way llama.cpp's converter writes it (Q/K rows permuted, Q8_0 weights),
    and the HF state dict holding the same dequantized values in transformers' layout."""
    t = TINY
    g = torch.Generator().manual_seed(5)

    def rnd(*shape, scale=None):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * (scale or shape[-1] ** -0.5)).float().numpy()

    def q8(a):  # what the file will hold, in transformers' layout (Q8_0 blocks run along rows)
        return gguf.quants.dequantize(gguf.quants.quantize(a, Q8), Q8).reshape(a.shape)

    hf, gg = {}, {}
    hf["model.embed_tokens.weight"] = gg["token_embd.weight"] = rnd(t["vocab"], t["d"], scale=1.0)
    hf["model.norm.weight"] = gg["output_norm.weight"] = (0.6 + 0.8 * torch.rand(t["d"], generator=g)).numpy()
    hf["lm_head.weight"] = q8(rnd(t["vocab"], t["d"]))
    gg["output.weight"] = (hf["lm_head.weight"], "q")
    for i in range(t["layers"]):
        s, b = f"model.layers.{i}", f"blk.{i}"
        for hn, gn in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm")):
            hf[f"{s}.{hn}.weight"] = gg[f"{b}.{gn}.weight"] = (0.6 + 0.8 * torch.rand(t["d"], generator=g)).numpy()
        for hn, gn, rows, perm in (
            ("self_attn.q_proj", "attn_q", t["heads"] * t["e"], t["heads"]),
            ("self_attn.k_proj", "attn_k", t["kv"] * t["e"], t["kv"]),
            ("self_attn.v_proj", "attn_v", t["kv"] * t["e"], None),
            ("self_attn.o_proj", "attn_output", t["d"], None),
            ("mlp.gate_proj", "ffn_gate", t["ff"], None),
            ("mlp.up_proj", "ffn_up", t["ff"], None),
        ):
            w = rnd(rows, t["d"])
            hf[f"{s}.{hn}.weight"] = q8(w)
            gg[f"{b}.{gn}.weight"] = (llama_cpp_permute(w, perm) if perm else w, "q")
        w = rnd(t["d"], t["ff"])
        hf[f"{s}.mlp.down_proj.weight"] = q8(w)
        gg[f"{b}.ffn_down.weight"] = (w, "q")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, "llama", gg)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": t["d"],
        "intermediate_size": t["ff"],
        "num_hidden_layers": t["layers"],
        "num_attention_heads": t["heads"],
        "num_key_value_heads": t["kv"],
        "head_dim": t["e"],
        "rms_norm_eps": 1e-5,
        "vocab_size": t["vocab"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        "tie_word_embeddings": False,
    }
    return (
        path,
        config,
        _Dict({k: torch.from_numpy(np.array(v, dtype=np.float32)).to(torch.float64) for k, v in hf.items()}),
    )


def write_gguf(path, arch, tensors, **extra):
    t = TINY
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(t["layers"])
    w.add_context_length(64)
    w.add_embedding_length(t["d"])
    w.add_feed_forward_length(t["ff"])
    w.add_head_count(t["heads"])
    w.add_head_count_kv(t["kv"])
    w.add_rope_freq_base(500.0)
    w.add_layer_norm_rms_eps(1e-5)
    for k, v in extra.items():
        w.add_uint32(f"{arch}.{k}", v)
    for name, v in tensors.items():
        if isinstance(v, tuple):
            a = np.ascontiguousarray(v[0], dtype=np.float32)
            w.add_tensor(name, gguf.quants.quantize(a, Q8), raw_dtype=Q8)
        else:
            w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_llama_matches_transformers_on_the_same_weights(tiny_gguf):
    path, config, hf = tiny_gguf
    ckpt = open_checkpoint(path)
    assert ckpt.format == "gguf" and not ckpt.cfg.tied and ckpt.cfg.n_kv_heads == 2 and ckpt.cfg.rope_base == 500.0
    assert "Q8_0" in ckpt.notes[0]
    tokens = torch.randint(0, TINY["vocab"], (3, 12), generator=torch.Generator().manual_seed(0))
    want = _logits(_reference(config, hf), tokens)
    model = ckpt.model()
    ours = model.forward(model.params, {"tokens": tokens})
    err, tol = _rel(ours, want), _tol(ckpt.cfg, 12)
    print(f"tiny GGUF (Q8_0) vs transformers: {err / EPS64:.2f} ε64, tol {tol / EPS64:.0f} ε64")
    assert err <= tol
    # the HF view of the GGUF (what transform writes) is exactly the dequantized HF state dict
    view = checkpoint_tensors(ckpt)
    assert all(torch.equal(view(k), hf[k]) for k in hf)


def _variant(ckpt, unpermute: bool, style: str):
    cfg = ckpt.cfg.with_(rope_style=style)
    return Checkpoint(ckpt.path, "gguf", ckpt.arch, ckpt.hf_config, cfg, ckpt.source, gguf_io.links(cfg, unpermute))


def _permutation_variants(ckpt, want, tokens):
    tol = _tol(ckpt.cfg, tokens.shape[1])
    errs = {}
    for unpermute, style in ((False, "half"), (False, "interleaved")):
        model = _variant(ckpt, unpermute, style).model()
        errs[(unpermute, style)] = _rel(model.forward(model.params, {"tokens": tokens}), want)
    print(
        f"llama.cpp rows + half RoPE: {errs[(False, 'half')]:.3g} relative; llama.cpp rows + interleaved RoPE: "
        f"{errs[(False, 'interleaved')] / EPS64:.2f} ε64 (tol {tol / EPS64:.0f} ε64)"
    )
    assert errs[(False, "half")] > 1e6 * tol  # not undoing the permutation: a different function
    assert errs[(False, "interleaved")] <= tol  # ... unless RoPE pairs (2i, 2i+1): the same function


def test_gguf_permutation_not_undone_fails_unless_rope_is_interleaved(tiny_gguf):
    path, config, hf = tiny_gguf
    tokens = torch.randint(0, TINY["vocab"], (3, 12), generator=torch.Generator().manual_seed(1))
    _permutation_variants(open_checkpoint(path), _logits(_reference(config, hf), tokens), tokens)


def test_gguf_transform_writes_safetensors_that_transformers_loads(tiny_gguf, tmp_path):
    from gauge_audit.transform import transform

    path, config, hf = tiny_gguf
    cert = transform(path, "stream-rotation", tmp_path / "out", seed=2)
    assert cert.verdict == "HOLDS" and cert.dtype == "float32" and "no tokenizer" in cert.notes[-1]
    model, info = transformers.LlamaForCausalLM.from_pretrained(
        str(tmp_path / "out"), dtype=torch.float64, attn_implementation="sdpa", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    float64_internals(model)
    tokens = torch.tensor(cert.inputs["tokens"])
    err = _rel(_logits(model.eval(), tokens), _logits(_reference(config, hf), tokens))
    tol = tolerance(
        Model("x", open_checkpoint(path).cfg, {}, FAMILIES["llama"]), cert.kappa, torch.float32, tokens.shape[1]
    )[0]
    print(f"tiny GGUF stream-rotation: transformers' logits change {err / EPS32:.3g} ε32, tol {tol / EPS32:.3g} ε32")
    assert err <= tol


def test_gguf_of_another_architecture_is_refused(tmp_path, capsys):
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, "gpt2", {"token_embd.weight": np.zeros((TINY["vocab"], TINY["d"]), dtype=np.float32)})
    with pytest.raises(GaugeAuditError, match="architecture 'gpt2'"):
        open_checkpoint(path)
    out = tmp_path / "out"
    assert main(["transform", "--checkpoint", str(path), "--action", "qk-gl", "--out", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()


def test_gguf_moe_and_truncated_and_nan_files_are_one_line_errors(tiny_gguf, tmp_path, capsys):
    path, _, _ = tiny_gguf
    moe = tmp_path / "moe.gguf"
    write_gguf(
        moe, "llama", {"token_embd.weight": np.zeros((TINY["vocab"], TINY["d"]), dtype=np.float32)}, expert_count=4
    )
    with pytest.raises(GaugeAuditError, match="expert_count"):
        open_checkpoint(moe)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    assert main(["check", "--checkpoint", str(cut), "--action", "qk-gl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("truncated" in err or "not a readable GGUF" in err)
    reader = Reference(str(path))
    tensors = {}
    for t in reader.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        tensors[t.name] = np.array(a, dtype=np.float32)
    tensors["blk.1.ffn_norm.weight"][3] = np.inf
    nan = tmp_path / "inf.gguf"
    write_gguf(nan, "llama", tensors)
    out = tmp_path / "out"
    assert main(["transform", "--checkpoint", str(nan), "--action", "qk-gl", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "blk.1.ffn_norm.weight" in err and "infinite" in err and not out.exists()


def test_reference_reader_reads_what_gguf_reads(tmp_path):
    """The tests' reference reader (gguf's parser on a plain array) and gguf.GGUFReader itself read
    the same fields and tensors, from a file with a vocabulary of 3000 strings (its tokens, their
    scores and types, merges, as a converter writes them) and quantized and float tensors."""
    g = np.random.default_rng(0)
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}-" + "x" * int(g.integers(0, 12)) for i in range(3000)])
    w.add_token_scores([float(v) for v in g.standard_normal(3000)])
    w.add_token_types([int(v) for v in g.integers(1, 6, 3000)])
    w.add_token_merges([f"a{i} b{i}" for i in range(500)])
    w.add_tensor(
        "token_embd.weight", gguf.quants.quantize(g.standard_normal((64, 32)).astype(np.float32), Q8), raw_dtype=Q8
    )
    w.add_tensor("output_norm.weight", g.standard_normal(32).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = Reference(str(path))
    assert len(ours.fields["tokenizer.ggml.tokens"].data) == 3000 and len(ours.tensors) == 2
    _read_alike(ours, gguf.GGUFReader(str(path)))


# ----------------------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="module")
def smol(model):
    return model("smollm2")


@pytest.fixture(scope="module")
def smol_reference(smol):
    """LlamaForCausalLM from SmolLM2's config and its dequantized state dict, float64 (exact and as shipped)."""
    ckpt = smollm2.checkpoint()
    tensors = checkpoint_tensors(ckpt, params=smol.params)
    names = {f for link in ckpt.arch.links(ckpt.cfg, lambda n: False) for f in link.files}
    sd = _Dict({n: tensors(n) for n in names})
    tokens = torch.randint(0, ckpt.cfg.vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    model = _reference(ckpt.hf_config, sd, exact=False)
    shipped = _logits(model, tokens)
    float64_internals(model)
    exact = _logits(model, tokens)
    return tokens, exact, shipped


def test_smollm2_config_is_read_from_the_file(smol):
    c = smol.cfg
    assert (c.family, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff, c.vocab) == (
        "llama",
        576,
        30,
        9,
        3,
        64,
        1536,
        49152,
    )
    assert c.tied and c.norm == "rmsnorm" and c.act == "swiglu" and c.rope_base == 1e5 and c.norm_eps == 1e-5
    assert c.rope_style == "half" and c.pos == "rope"


@pytest.mark.parametrize(
    "model,own,every",
    [(smollm2, {"Q4_1", "Q8_0"}, True), (gemma3, {"Q5_0", "Q4_K", "Q6_K", "Q8_0"}, False)],
    ids=["smollm2", "gemma3"],
)
def test_packaged_gguf_dequantized_bit_for_bit_as_the_gguf_package_does(model, own, every):
    """The reader's own Q4_1 / Q8_0 / Q5_0 / Q4_K / Q6_K dequantization gives the packaged files'
    tensors bit for bit as gguf.quants.dequantize (float32 bit patterns compared, not values within
    a tolerance): every tensor of SmolLM2; of Gemma 3, whose reference dequantization in numpy takes
    a minute, the first two tensors of each type.  The reference dequantizes a tensor's first and
    last rows and 62 rows drawn from a seed (all of them where it has fewer, every entry of a
    vector): the reader dequantizes whole tensors, so a row misplaced or a block misread anywhere
    shows in the rows compared, and the numpy reference costs a fraction of the whole tensor's."""
    f = gguf_io.GGUFFile(model.path())
    reader = Reference(str(model.path()))
    rng = np.random.default_rng(0)
    kinds: dict[str, int] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if not (every or kinds.get(kind, 0) < 2):
            continue
        got = f.get(t.name)
        assert tuple(got.shape) == tuple(reversed(t.shape.tolist())) and got.dtype == torch.float32
        data = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data[None]
        n = data.shape[0]
        rows = np.unique(np.concatenate([[0, n - 1], rng.choice(n, size=min(n, 62), replace=False)]))
        want = np.array(gguf.quants.dequantize(data[rows], t.tensor_type), dtype=np.float32)
        mine = got.numpy().reshape(n, -1)[rows]
        assert np.array_equal(mine.view(np.int32), want.reshape(mine.shape).view(np.int32)), t.name
        kinds[kind] = kinds.get(kind, 0) + 1
    assert own <= set(kinds)  # each of the reader's own paths was compared


def test_smollm2_matches_transformers_llama_float64(smol, smol_reference):
    tokens, exact, shipped = smol_reference
    ours = smol.forward(smol.params, {"tokens": tokens})
    err, tol = _rel(ours, exact), _tol(smol.cfg, tokens.shape[1])
    print(f"SmolLM2 vs LlamaForCausalLM (float64 internals): {err / EPS64:.1f} ε64, tol L·K·ε = {tol / EPS64:.0f} ε64")
    assert err <= tol
    e2, tol32 = _rel(ours, shipped), _tol(smol.cfg, tokens.shape[1], torch.float32)
    print(
        f"SmolLM2 vs LlamaForCausalLM as shipped (float32 RMSNorm/RoPE): {e2 / EPS32:.2f} ε32, tol {tol32 / EPS32:.0f} ε32"
    )
    assert e2 <= tol32


def test_smollm2_permutation_not_undone_fails_by_a_wide_margin(smol_reference):
    tokens, exact, _ = smol_reference
    _permutation_variants(smollm2.checkpoint(), exact, tokens)


def test_smollm2_check_cli(capsys):
    assert main(["check", "--model", "smollm2", "--action", "qk-gl", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["verdict"] == "HOLDS" and row["model"] == "smollm2" and row["extra"]["next_token_unchanged"]
    assert main(["check", "--model", "smollm2", "--action", "qk-gl-rope-generic", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["verdict"] == "FAILS" and row["max_rel_error"] > 1e-3


def test_smollm2_check_text_prompt(capsys):
    assert main(["check", "--model", "smollm2", "--action", "vo-gl", "--text", "The capital of France is"]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "HOLDS" in out and "next token" in out and "unchanged" in out


def test_smollm2_transform_loads_in_transformers_with_the_same_next_token(smol, tmp_path, capsys):
    out = tmp_path / "smol-qk"
    assert (
        main(["transform", "--checkpoint", str(smollm2.path()), "--action", "qk-gl", "--out", str(out), "--json"]) == 0
    )
    cert = json.loads(capsys.readouterr().out)
    print({k: cert[k] for k in ("max_rel_change", "residual_eps", "tolerance_eps", "verdict", "dtype")})
    assert cert["verdict"] == "HOLDS" and cert["format"] == "gguf" and cert["dtype"] == "float32"
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float64, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    after = _logits(model.eval(), ids)[0, -1]
    before = smol.forward(smol.params, {"tokens": ids})[0, -1]
    print(f"next token: {tok.decode(before.argmax())!r} -> {tok.decode(after.argmax())!r}")
    assert int(after.argmax()) == int(before.argmax())
    top2 = before.topk(2).values
    # not a rounding tie: the top-2 gap is far above the measured change of the logits
    assert float(top2[0] - top2[1]) > 1e3 * cert["max_rel_change"] * float(before.abs().max())


def test_smollm2_tokenizer_is_the_one_autotokenizer_converts(tmp_path, monkeypatch):
    """The GGUF vocabulary's tokenizer is built by the class AutoTokenizer chooses, found from the
    model type already read (AutoTokenizer reads the file's metadata again for it): the saved
    files are byte for byte AutoTokenizer's."""
    from gauge_audit.reference import _tokenizer, tokenizer

    ckpt = smollm2.checkpoint()
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _tokenizer.cache_clear()
    tokenizer(ckpt).save_pretrained(str(ours))
    monkeypatch.setattr(gguf, "GGUFReader", Reference)  # the config AutoTokenizer reads again: 4.5 s → 1.5 s
    transformers.AutoTokenizer.from_pretrained(str(ckpt.path.parent), gguf_file=ckpt.path.name).save_pretrained(
        str(theirs)
    )
    names = sorted(p.name for p in ours.iterdir())
    assert names == sorted(p.name for p in theirs.iterdir()) and "tokenizer.json" in names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
