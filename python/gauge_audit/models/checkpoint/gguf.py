"""GGUF checkpoints of the llama architecture (llama.cpp's format), read with the ``gguf``
package: metadata → the HF ``LlamaForCausalLM`` config, tensors dequantized (Q4_0, Q4_1, Q8_0,
K-quants, F16, …) to float32 one at a time.

llama.cpp's converter permutes the rows of ``W_Q`` and ``W_K`` inside every head, from the
half-split RoPE pairing (i, i + e/2) of the HF checkpoint to the interleaved pairing
(2i, 2i+1) its kernels rotate::

    gguf = hf.reshape(n, 2, e/2, d).swapaxes(1, 2).reshape(n·e, d)      (convert_hf_to_gguf.py)

Here the permutation is **undone** (:func:`unpermute`), so the parameters equal the HF
model's, RoPE stays ``rope_style="half"``, and a GGUF converts to a safetensors checkpoint
that ``LlamaForCausalLM`` loads.  (Keeping the GGUF rows with ``rope_style="interleaved"`` is
the same function — a per-head relabelling of the query/key coordinates — and
``tests/test_checkpoint_gguf.py`` shows both agree with transformers while the permuted rows
with half-split RoPE do not.)
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ...errors import GaugeAuditError
from ..config import Config
from .hf import Link, linear, linear_heads, linear_out_heads, llama_like_config, same

ARCH = "llama"


def unpermute(w: torch.Tensor, n: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row permutation of a Q/K weight (n·e, d) or bias (n·e,)."""
    rows = w.shape[0]
    return w.reshape(n, rows // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: torch.Tensor, n: int) -> torch.Tensor:
    """llama.cpp's permutation (HF half-split rows → interleaved rows), the inverse of :func:`unpermute`."""
    rows = w.shape[0]
    return w.reshape(n, 2, rows // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_heads(f: str, p: str, n: int) -> Link:
    """attn_q / attn_k (n·e, d) in llama.cpp's row order → per head (n, d, e) in HF's order."""
    hf = linear_heads(f, p, n)
    return Link(hf.files, hf.params, lambda w: hf.read(unpermute(w, n)))


def _short(x) -> float:
    """A float32 metadata value as the decimal it was written from (9.9999997e-06 → 1e-05)."""
    return float(str(np.float32(x)))


class GGUFFile:
    """A GGUF file: metadata, tensor names/shapes (torch order), dequantized float32 reads."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self.reader = GGUFReader(str(self.path))
        except FileNotFoundError:
            raise GaugeAuditError(f"no such file: {self.path}") from None
        except (ValueError, OSError, IndexError, KeyError, TypeError, UnicodeDecodeError, struct.error) as exc:
            raise GaugeAuditError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else 'truncated or corrupt'})") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        size = self.path.stat().st_size
        for t in self.reader.tensors:
            if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
                raise GaugeAuditError(f"{self.path}: truncated GGUF file (tensor {t.name} extends past the end)")
        self.entries = {n: (torch.float32, tuple(int(s) for s in reversed(t.shape.tolist())))
                        for n, t in self.tensors.items()}

    def field(self, key: str, default=None):
        f = self.reader.fields.get(key)
        return default if f is None else f.contents()

    def quant_types(self) -> dict[str, int]:
        return dict(Counter(t.tensor_type.name for t in self.tensors.values()))

    def get(self, name: str) -> torch.Tensor:
        from gguf.quants import dequantize

        t = self.tensors[name]
        try:
            a = dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise GaugeAuditError(f"{self.path}: tensor {name}: {exc}") from None
        return torch.from_numpy(np.array(a, dtype=np.float32, copy=True)).reshape(self.entries[name][1])


def hf_config(g: GGUFFile) -> dict:
    """The ``LlamaForCausalLM`` config.json that the GGUF metadata describes; options the llama
    family cannot represent are refused with the GGUF key."""
    arch = g.field("general.architecture")
    if arch != ARCH:
        raise GaugeAuditError(f"{g.path}: GGUF architecture {arch!r} is not supported (only {ARCH!r})")

    def key(k, default=None):
        return g.field(f"{ARCH}.{k}", default)

    def no(k, why):
        v = key(k)
        if v not in (None, 0, "none", ""):
            raise GaugeAuditError(f"{g.path}: unsupported GGUF option {ARCH}.{k}={v!r}: {why}")

    no("expert_count", "mixture-of-experts GGUF files are not supported (use the HF checkpoint)")
    no("rope.scaling.type", "RoPE scaling changes the rotation angles")
    no("attention.sliding_window", "sliding-window attention")
    if "rope_freqs.weight" in g.tensors:
        raise GaugeAuditError(f"{g.path}: unsupported GGUF tensor rope_freqs.weight: RoPE frequency scaling")
    d, h = int(key("embedding_length")), int(key("attention.head_count"))
    e = int(key("attention.key_length", d // h))
    if int(key("attention.value_length", e)) != e:
        raise GaugeAuditError(f"{g.path}: unsupported GGUF option: key_length {e} ≠ value_length")
    if int(key("rope.dimension_count", e)) != e:
        raise GaugeAuditError(f"{g.path}: unsupported GGUF option {ARCH}.rope.dimension_count="
                              f"{key('rope.dimension_count')}: partial rotary embedding")
    vocab = key("vocab_size")
    if vocab is None:
        vocab = g.entries["token_embd.weight"][1][0] if "token_embd.weight" in g.entries else 0
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
          "intermediate_size": int(key("feed_forward_length")), "num_hidden_layers": int(key("block_count")),
          "num_attention_heads": h, "num_key_value_heads": int(key("attention.head_count_kv", h)), "head_dim": e,
          "rms_norm_eps": _short(key("attention.layer_norm_rms_epsilon", 1e-5)),
          "rope_parameters": {"rope_type": "default", "rope_theta": _short(key("rope.freq_base", 10000.0))},
          "max_position_embeddings": int(key("context_length", 2048)), "vocab_size": int(vocab),
          "tie_word_embeddings": "output.weight" not in g.tensors, "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "dtype": "float32"}
    for name, k in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("pad_token_id", "padding_token_id")):
        v = g.field(f"tokenizer.ggml.{k}")
        if v is not None:
            hf[name] = int(v)
    return hf


def config(g: GGUFFile, hf: dict) -> Config:
    try:
        return llama_like_config("LlamaForCausalLM", hf)
    except GaugeAuditError as exc:
        raise GaugeAuditError(f"{g.path}: {exc}") from None


def links(cfg: Config, unpermute_qk: bool = True) -> list[Link]:
    """GGUF tensor names → the project's layout (read only: outputs are written as HF safetensors).
    ``unpermute_qk=False`` keeps llama.cpp's Q/K row order (only right with interleaved RoPE)."""
    qk = _gguf_heads if unpermute_qk else linear_heads
    out = [same("token_embd.weight", "embed.W_E")]
    for i in range(cfg.n_layers):
        s, p = f"blk.{i}", f"blocks.{i}"
        out += [same(f"{s}.attn_norm.weight", f"{p}.ln1.w"), same(f"{s}.ffn_norm.weight", f"{p}.ln2.w"),
                qk(f"{s}.attn_q.weight", f"{p}.attn.W_Q", cfg.n_heads),
                qk(f"{s}.attn_k.weight", f"{p}.attn.W_K", cfg.n_kv_heads),
                linear_heads(f"{s}.attn_v.weight", f"{p}.attn.W_V", cfg.n_kv_heads),
                linear_out_heads(f"{s}.attn_output.weight", f"{p}.attn.W_O", cfg.n_heads),
                linear(f"{s}.ffn_gate.weight", f"{p}.mlp.W_gate"), linear(f"{s}.ffn_up.weight", f"{p}.mlp.W_in"),
                linear(f"{s}.ffn_down.weight", f"{p}.mlp.W_out")]
    out.append(same("output_norm.weight", "ln_final.w"))
    if not cfg.tied:
        out.append(linear("output.weight", "unembed.W_U"))
    return out

