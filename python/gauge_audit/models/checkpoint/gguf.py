"""GGUF checkpoints of the llama architecture (and llama.cpp's gemma3, see gemma.py) (llama.cpp's format), read with the ``gguf``
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

import math
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ...errors import GaugeAuditError
from ..config import Config
from .gemma import gemma_config, gguf_hf_config
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


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Header:
    """A cursor over the GGUF header (little-endian, version 2 or 3)."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self, decode: bool = True):
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise ValueError("string runs past the end of the file")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8") if decode else None

    def value(self, kind: int, decode: bool = True):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string(decode)
        if kind == _ARRAY:
            sub, n = self.take("<I"), self.take("<Q")
            if sub in _SCALARS and sub != _STRING:  # fixed size: skip or read in one go
                size = struct.calcsize(_SCALARS[sub])
                if decode:
                    out = list(struct.unpack_from(f"<{n}{_SCALARS[sub][1]}", self.data, self.pos))
                self.pos += n * size
                return out if decode else None
            items = [self.value(sub, decode) for _ in range(n)]
            return items if decode else None
        raise ValueError(f"unknown GGUF value type {kind}")


class GGUFFile:
    """A GGUF file: metadata, tensor names/shapes (torch order), dequantized float32 reads.

    The header is parsed here (arrays such as the 49 152-token vocabulary are skipped, not
    decoded — GGUFReader decodes every string and takes seconds); the quantization formats and
    the dequantization come from the ``gguf`` package."""

    def __init__(self, path: Path):
        import mmap

        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                self.fields, infos, start = self._parse(data)
        except FileNotFoundError:
            raise GaugeAuditError(f"no such file: {self.path}") from None
        except (ValueError, OSError, struct.error, UnicodeDecodeError, OverflowError) as exc:
            raise GaugeAuditError(f"{self.path}: not a readable GGUF file ({exc})") from None
        self.tensors: dict[str, tuple] = {}  # name -> (quant type, torch shape, absolute offset, bytes)
        for name, dims, kind, offset in infos:
            try:
                qtype = GGMLQuantizationType(kind)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise GaugeAuditError(f"{self.path}: tensor {name} has an unknown GGML type {kind}") from None
            n = math.prod(dims)
            if dims and dims[0] % block:
                raise GaugeAuditError(
                    f"{self.path}: tensor {name}: row length {dims[0]} is not a multiple of "
                    f"the {qtype.name} block size {block}"
                )
            nbytes = n // block * type_size
            if start + offset + nbytes > size:
                raise GaugeAuditError(f"{self.path}: truncated GGUF file (tensor {name} extends past the end)")
            self.tensors[name] = (qtype, tuple(reversed(dims)), start + offset, nbytes)
        self.entries = {n: (torch.float32, t[1]) for n, t in self.tensors.items()}

    @staticmethod
    def _parse(data) -> tuple[dict, list, int]:
        h = _Header(data)
        if bytes(data[:4]) != b"GGUF":
            raise ValueError("bad magic")
        h.pos = 4
        version = h.take("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (or big-endian) is not supported")
        n_tensors, n_kv = h.take("<Q"), h.take("<Q")
        fields = {}
        for _ in range(n_kv):
            key = h.string()
            kind = h.take("<I")
            # decode scalars and short arrays; skip the long ones (vocabulary, merges)
            if kind == _ARRAY:
                mark = h.pos
                sub, count = h.take("<I"), h.take("<Q")
                h.pos = mark
                fields[key] = h.value(kind, decode=count <= 64 and sub != _STRING)
            else:
                fields[key] = h.value(kind)
        infos = []
        for _ in range(n_tensors):
            name = h.string()
            dims = [h.take("<Q") for _ in range(h.take("<I"))]
            infos.append((name, dims, h.take("<I"), h.take("<Q")))
        align = fields.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ValueError(f"invalid general.alignment {align!r}")
        return fields, infos, -(-h.pos // align) * align

    def field(self, key: str, default=None):
        v = self.fields.get(key)
        return default if v is None else v

    def quant_types(self) -> dict[str, int]:
        return dict(Counter(t[0].name for t in self.tensors.values()))

    def get(self, name: str) -> torch.Tensor:
        """Dequantized to float32.  The bytes are read with a positioned read, not through a memory
        map (touched map pages would stay resident: memory growing with the file)."""
        from gguf import GGML_QUANT_SIZES
        from gguf.quants import dequantize

        qtype, shape, offset, nbytes = self.tensors[name]
        buf = bytearray(nbytes)
        with open(self.path, "rb") as f:
            f.seek(offset)
            if f.readinto(buf) != nbytes:
                raise GaugeAuditError(f"{self.path}: truncated while reading tensor {name}")
        block, type_size = GGML_QUANT_SIZES[qtype]
        fast = _dequantize_blocks(torch.frombuffer(buf, dtype=torch.uint8).reshape(-1, type_size), qtype.name)
        if fast is not None:
            return fast.reshape(shape)
        row = shape[-1] // block * type_size if shape else nbytes
        raw = np.frombuffer(buf, dtype=np.uint8).reshape(-1, row)
        try:
            a = dequantize(raw, qtype)
        except NotImplementedError as exc:
            raise GaugeAuditError(f"{self.path}: tensor {name}: {exc}") from None
        return torch.from_numpy(np.asarray(a, dtype=np.float32)).reshape(shape)


def _f16(blocks: torch.Tensor, lo: int) -> torch.Tensor:
    """The float16 at bytes lo, lo+1 of every block, widened to float32, as a column."""
    return blocks[:, lo : lo + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes (…, k) → their low nibbles then their high nibbles (…, 2, k)."""
    return torch.stack([qs & 0x0F, qs >> 4], -2)


def _dequantize_blocks(blocks: torch.Tensor, qtype: str) -> torch.Tensor | None:
    """Q4_1, Q8_0, Q5_0, Q4_K and Q6_K blocks (one per row of ``blocks``) dequantized to float32
    in torch: the arithmetic of the ``gguf`` package's ``dequantize_blocks`` (float16 scales
    widened, the same float32 products and sums in the same order: bit for bit the same values),
    without its numpy passes over groups of 16 rows, which took most of a read.  None for the other
    types (read by ``gguf``).  The products and sums are formed in place in the widened entries
    (the same operations: a product's order does not change its rounding)."""
    n = blocks.shape[0]
    if qtype == "Q5_0":  # d (f16), 32 high bits (u32), 16 bytes of low nibbles; entries − 16
        qh = blocks[:, 2:6].contiguous().view(torch.int32)  # bit i of it: entry i's fifth bit
        high = ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)
        q = (_nibbles(blocks[:, 6:]).reshape(n, 32) | (high << 4)).to(torch.int8) - 16
        return q.to(torch.float32).mul_(_f16(blocks, 0))
    if qtype == "Q4_K":  # d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
        sc = blocks[:, 4:16].reshape(n, 3, 4)
        lo, mid, top = sc[:, 0], sc[:, 1], sc[:, 2]
        scale = torch.cat([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], -1).to(torch.float32)
        mins = torch.cat([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], -1).to(torch.float32)
        d = (_f16(blocks, 0) * scale).reshape(n, 8, 1)
        dm = (_f16(blocks, 2) * mins).reshape(n, 8, 1)
        q = _nibbles(blocks[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32).to(torch.float32)
        return q.mul_(d).sub_(dm).reshape(n, 256)
    if qtype == "Q6_K":  # 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, d (f16)
        scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
        d = (_f16(blocks, 208) * scales).reshape(n, 16, 1)
        ql = _nibbles(blocks[:, :128].reshape(n, 2, 64)).reshape(n, 8, 32)
        qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(
            1, 1, 4, 1
        )
        q = (ql | ((qh & 0x03).reshape(n, 8, 32) << 4)).to(torch.int8) - 32
        return q.reshape(n, 16, 16).to(torch.float32).mul_(d).reshape(n, 256)
    if qtype == "Q4_1":  # d (f16), m (f16), 16 bytes: low nibbles are entries 0–15, high 16–31
        d = blocks[:, 0:2].contiguous().view(torch.float16).to(torch.float32)
        m = blocks[:, 2:4].contiguous().view(torch.float16).to(torch.float32)
        qs = blocks[:, 4:]
        return torch.cat([qs & 0x0F, qs >> 4], 1).to(torch.float32).mul_(d).add_(m)
    if qtype == "Q8_0":  # d (f16), 32 signed bytes
        d = blocks[:, 0:2].contiguous().view(torch.float16).to(torch.float32)
        return blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32).mul_(d)
    return None


def hf_config(g: GGUFFile) -> dict:
    """The ``LlamaForCausalLM`` config.json that the GGUF metadata describes; options the llama
    family cannot represent are refused with the GGUF key."""
    arch = g.field("general.architecture")
    if arch == "gemma3":
        return gguf_hf_config(g, _short)
    if arch != ARCH:
        raise GaugeAuditError(f"{g.path}: GGUF architecture {arch!r} is not supported (only {ARCH!r} and 'gemma3')")

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
        raise GaugeAuditError(
            f"{g.path}: unsupported GGUF option {ARCH}.rope.dimension_count="
            f"{key('rope.dimension_count')}: partial rotary embedding"
        )
    vocab = key("vocab_size")
    if vocab is None:
        vocab = g.entries["token_embd.weight"][1][0] if "token_embd.weight" in g.entries else 0
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": h,
        "num_key_value_heads": int(key("attention.head_count_kv", h)),
        "head_dim": e,
        "rms_norm_eps": _short(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_parameters": {"rope_type": "default", "rope_theta": _short(key("rope.freq_base", 10000.0))},
        "max_position_embeddings": int(key("context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "dtype": "float32",
    }
    for name, k in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        v = g.field(f"tokenizer.ggml.{k}")
        if v is not None:
            hf[name] = int(v)
    return hf


def config(g: GGUFFile, hf: dict) -> Config:
    try:
        if hf["architectures"][0] == "Gemma3ForCausalLM":
            return gemma_config("Gemma3ForCausalLM", hf)
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
        out += [
            same(f"{s}.attn_norm.weight", f"{p}.ln1.w"),
            same(f"{s}.ffn_norm.weight", f"{p}.ln2.w"),
            qk(f"{s}.attn_q.weight", f"{p}.attn.W_Q", cfg.n_heads),
            qk(f"{s}.attn_k.weight", f"{p}.attn.W_K", cfg.n_kv_heads),
            linear_heads(f"{s}.attn_v.weight", f"{p}.attn.W_V", cfg.n_kv_heads),
            linear_out_heads(f"{s}.attn_output.weight", f"{p}.attn.W_O", cfg.n_heads),
            linear(f"{s}.ffn_gate.weight", f"{p}.mlp.W_gate"),
            linear(f"{s}.ffn_up.weight", f"{p}.mlp.W_in"),
            linear(f"{s}.ffn_down.weight", f"{p}.mlp.W_out"),
        ]
    out.append(same("output_norm.weight", "ln_final.w"))
    if not cfg.tied:
        out.append(linear("output.weight", "unembed.W_U"))
    return out


def gemma3_links(cfg: Config) -> list[Link]:
    """gemma3 GGUF names: the llama layout without the Q/K row permutation (llama.cpp leaves Gemma's
    rows in Hugging Face order, NeoX RoPE), plus the post-norms and the QK-norms.  The norm weights
    are stored as γ = 1 + w already, the project's own convention, so every norm maps unchanged."""
    out = links(cfg, unpermute_qk=False)
    for i in range(cfg.n_layers):
        s, p = f"blk.{i}", f"blocks.{i}"
        out += [
            same(f"{s}.post_attention_norm.weight", f"{p}.ln1_post.w"),
            same(f"{s}.post_ffw_norm.weight", f"{p}.ln2_post.w"),
        ]
        if cfg.qk_norm == "head":
            out += [
                same(f"{s}.attn_q_norm.weight", f"{p}.attn.q_norm"),
                same(f"{s}.attn_k_norm.weight", f"{p}.attn.k_norm"),
            ]
    return out
