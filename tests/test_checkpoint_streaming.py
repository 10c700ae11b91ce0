"""Large tensors read and written in pieces (what keeps an 8 B-parameter checkpoint within a few GB):
the chunked float64 reads straight into the project layout, the reference's embedding and head loaded
only while their modules run, the chunked writer and the pass-through of untouched globals — each equal,
bit for bit, to the whole-tensor path.  The size thresholds are lowered so the tiny checkpoints take
every piecewise path."""

from __future__ import annotations

import pytest
import torch

from gauge_audit.actions import get_action
from gauge_audit.actions.blockwise import TransformedParams
from gauge_audit.models import checkpoint as ck
from gauge_audit.models.checkpoint import open_checkpoint
from gauge_audit.models.checkpoint import safetensors_file as sf
from gauge_audit.runtime import StoragePool, generator

transformers = pytest.importorskip("transformers")
from gauge_audit import reference  # noqa: E402
from gauge_audit.reference import Reference, checkpoint_tensors  # noqa: E402

KINDS = ["gpt2", "gpt2-untied", "bert", "llama", "llama-bias-tied", "qwen", "mixtral"]


def _pieces(monkeypatch):
    monkeypatch.setattr(sf, "CHUNK", 40)  # bytes: less than one row of most tensors, a few rows of others
    monkeypatch.setattr(ck, "DIRECT", 0)  # every one-tensor link read straight into its result
    monkeypatch.setattr(reference, "BIG", 1)  # every global matrix loaded by its module's hooks


def _inputs(cfg):
    g = torch.Generator().manual_seed(0)
    x = {"tokens": torch.randint(0, cfg.vocab, (2, 9), generator=g)}
    if cfg.n_types:
        x["token_types"] = torch.randint(0, cfg.n_types, (2, 9), generator=g)
    return x


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_piecewise_reads_equal_whole_reads(tiny_hf, monkeypatch, kind, dtype):
    ckpt = open_checkpoint(tiny_hf(kind, dtype))
    whole = {k: v for k, v in ckpt.params().items()}
    raw = {f: ckpt.raw(f).to(torch.float64) for f in ckpt.source.entries}
    _pieces(monkeypatch)
    calls = []
    read_into = ckpt.source.read_into
    monkeypatch.setattr(
        ckpt.source, "read_into", lambda f, out, check=None: (calls.append(f), read_into(f, out, check))[1]
    )
    pieces = ckpt.params()
    for k, v in whole.items():
        got = pieces[k]
        assert got.dtype == torch.float64 and got.shape == v.shape and torch.equal(got, v), k
    assert calls, "no tensor took the piecewise path"
    for f, v in raw.items():
        assert torch.equal(ckpt.raw(f, torch.float64), v), f


def test_storage_pool_reuses_only_storages_nothing_uses():
    pool = StoragePool()
    a = pool.empty((6, 5))
    first = a.data_ptr()
    view = a.T
    del a
    assert pool.empty((5, 6)).data_ptr() != first  # a view still reads it: a fresh storage
    del view
    b = pool.empty((3, 10))  # the same size, now free: handed out again, in the shape asked for
    assert b.data_ptr() == first and b.shape == (3, 10) and b.is_contiguous() and b.dtype == torch.float64
    kept = pool.empty((7,))  # no free storage fits: the free ones are released first
    assert len(pool._storages) == 2  # b's and the new one (the unused (5, 6) one was released)
    del kept
    pool.clear()
    assert pool.empty((3, 10)).data_ptr() != first  # b is alive; cleared pools hold nothing


def test_streamed_blocks_reuse_the_storages_of_the_block_before(tiny_hf, monkeypatch):
    """Block after block of a checkpoint streamed with ``reuse`` (check's forwards), each large read
    takes the storage its predecessor of the same shape left, and reads the same values."""
    ckpt = open_checkpoint(tiny_hf("llama"))
    whole = dict(ckpt.params().items())
    _pieces(monkeypatch)
    params = ckpt.params(reuse=True)
    name = "blocks.{}.mlp.W_in"
    t0 = params[name.format(0)]
    ptr = t0.data_ptr()
    assert torch.equal(t0, whole[name.format(0)])
    del t0
    t1 = params[name.format(1)]
    assert t1.data_ptr() == ptr and torch.equal(t1, whole[name.format(1)])
    held = params[name.format(0)]  # t1 still alive: a storage of its own
    assert held.data_ptr() != t1.data_ptr() and torch.equal(held, whole[name.format(0)])


@pytest.mark.parametrize("kind", KINDS)
def test_reference_with_streamed_embeddings_is_unchanged(tiny_hf, monkeypatch, kind):
    ckpt = open_checkpoint(tiny_hf(kind))
    x = _inputs(ckpt.cfg)
    before = Reference(ckpt.arch, ckpt.hf_config, ckpt.cfg).forward(checkpoint_tensors(ckpt), x)
    _pieces(monkeypatch)
    ref = Reference(ckpt.arch, ckpt.hf_config, ckpt.cfg)
    assert ref.streamed, "no global matrix streamed"
    after = ref.forward(checkpoint_tensors(ckpt), x)
    assert torch.equal(after, before)
    via_layout = ref.forward(checkpoint_tensors(ckpt, params=ckpt.params()), x)
    assert torch.equal(via_layout, before)
    # nothing stays loaded between forwards
    for key in ref.streamed:
        assert ref._meta(key).is_meta, key


def test_chunked_writer_writes_the_same_bytes(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(7, 5, dtype=torch.float64, generator=g)
    tensors = {
        "t": (w.T, torch.bfloat16),
        "c": (w[:, 1:4], torch.float32),
        "s": (w[0, 0], torch.float64),
        "e": (torch.empty(0, 3), torch.float32),
        "v": (w[2], torch.float16),
    }
    plan = {k: (dt, tuple(t.shape)) for k, (t, dt) in tensors.items()}
    for name, chunk in (("whole.safetensors", 1 << 30), ("pieces.safetensors", 6)):
        monkeypatch.setattr(sf, "CHUNK", chunk)
        with sf.SafetensorsWriter(tmp_path / name, plan) as out:
            for k, (t, _) in tensors.items():
                out.write(k, t)
    assert (tmp_path / "whole.safetensors").read_bytes() == (tmp_path / "pieces.safetensors").read_bytes()
    back = sf.SafetensorsFile(tmp_path / "pieces.safetensors")
    for k, (t, dt) in tensors.items():
        assert torch.equal(back.get(k), t.to(dt)), k


def test_untouched_globals_pass_through(tiny_hf):
    """An element acting on the blocks only leaves the embeddings and head as read: nothing of them
    is cached (for an 8 B model they are 8.4 GB in float64)."""
    ckpt = open_checkpoint(tiny_hf("llama"))
    params = ckpt.params()
    act = get_action("vo-gl")
    new = TransformedParams(act, ckpt.cfg, params, act.sample(ckpt.cfg, params, generator(1), 10.0))
    for k in ("embed.W_E", "unembed.W_U"):
        assert torch.equal(new[k], params[k])
    assert new._globals is None


def test_a_nan_is_found_on_the_piecewise_path(tiny_hf, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from gauge_audit.errors import GaugeAuditError

    src = tiny_hf("llama")
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    sd = load_file(str(bad / "model.safetensors"))
    sd["lm_head.weight"][-1, -1] = float("nan")  # in the last chunk
    save_file(sd, str(bad / "model.safetensors"))
    _pieces(monkeypatch)
    params = open_checkpoint(bad).params()
    with pytest.raises(GaugeAuditError, match="lm_head.weight contains NaN"):
        params["unembed.W_U"]
