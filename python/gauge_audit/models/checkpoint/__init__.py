"""Real checkpoints in the project's parameter layout: a local Hugging Face directory
(``config.json`` + ``model.safetensors`` or a sharded index) or a llama GGUF file.

    ckpt = open_checkpoint("path/to/dir_or.gguf")
    ckpt.cfg                       # the family Config (every function-changing option read)
    p = ckpt.params()              # LazyParams: project-layout float64 tensors, read on access
    model = ckpt.model()           # a Model whose forward streams block by block
    write_hf(out_dir, ckpt, cfg, params)   # project layout → an HF directory (see writer.py)

Opening validates everything that can be validated without reading the weights: the header
of every safetensors file against its size, the config against the families (one line naming
any option they cannot represent), every tensor's presence and shape against the config, and
no unknown tensors.  Reading a tensor checks it for NaN / ∞.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import math
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import GaugeAuditError
from ...runtime import StoragePool, available_memory, resolve_device
from ..config import Config
from ..families import FAMILIES
from ..lazy import LazyParams
from ..model import Model
from . import gemma as gemma_io
from . import gguf as gguf_io
from .hf import ARCHS as _HF_ARCHS
from .hf import Arch, Link, arch_of
from .hf_deepseek import DEEPSEEK_ARCHS
from .hf_fused import FUSED_ARCHS
from .hf_qknorm import QK_NORM_ARCHS
from .safetensors_file import SafetensorsFile

_GEMMA_ARCHS: dict[str, Arch] = {}
for _name in (*gemma_io.CAUSAL, gemma_io.MULTIMODAL):
    _mm = _name == gemma_io.MULTIMODAL  # transformers' module path / the file names of its layers differ
    _GEMMA_ARCHS[_name] = Arch(
        _name,
        gemma_io.gemma_config,
        gemma_io.links_for(_name),
        "model.language_model.layers" if _mm else "model.layers",
        "language_model.model.layers.{i}." if _mm else "model.layers.{i}.",
        "AutoModelForCausalLM",
        ignore=r".*rotary_emb\..*inv_freq$",
        soft_capped=_name == gemma_io.SOFT_CAPPED,
        passthrough=r"(model\.)?(vision_tower|multi_modal_projector)\..*",
        notes=(
            ("the vision tower and projector are copied unchanged and not checked",)
            if _name == gemma_io.MULTIMODAL
            else ()
        ),
    )

# float64 bytes from which a one-tensor link is read straight into its result (from 32 MiB on glibc
# maps every allocation afresh: these are the reads that ``params(reuse=True)`` takes from its pool)
DIRECT = 1 << 25

ARCHS: dict[str, Arch] = {**_HF_ARCHS, **QK_NORM_ARCHS, **FUSED_ARCHS, **_GEMMA_ARCHS, **DEEPSEEK_ARCHS}
__all__ = ["Checkpoint", "open_checkpoint", "Link", "Arch", "ARCHS"]


class HFDir:
    """The weights of a Hugging Face directory: one safetensors file or a sharded index."""

    def __init__(self, path: Path):
        self.path = path
        single, index = path / "model.safetensors", path / "model.safetensors.index.json"
        if single.is_file():
            files = [SafetensorsFile(single)]
            weight_map = None
        elif index.is_file():
            weight_map = _json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise GaugeAuditError(f"{index}: no weight_map")
            names = sorted(set(weight_map.values()))
            for shard in names:
                if "/" in shard or "\\" in shard or not (path / shard).is_file():
                    raise GaugeAuditError(f"{index}: shard {shard!r} is missing")
            files = [SafetensorsFile(path / shard) for shard in names]
        else:
            raise GaugeAuditError(
                f"{path}: no model.safetensors or model.safetensors.index.json (pickled "
                "pytorch_model.bin files are not read: loading them can run code)"
            )
        self.where: dict[str, SafetensorsFile] = {}
        self.entries: dict[str, tuple] = {}
        for f in files:
            for name, entry in f.entries.items():
                if name in self.where:
                    raise GaugeAuditError(f"{path}: tensor {name} appears in two shards")
                self.where[name], self.entries[name] = f, entry
        if weight_map is not None:
            for name, shard in weight_map.items():
                if name not in self.where or self.where[name].path.name != shard:
                    raise GaugeAuditError(f"{index}: the index puts {name} in {shard}, but that shard does not hold it")

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.where[name].get(name, dtype)

    def read_into(self, name: str, out: torch.Tensor, check=None) -> None:
        self.where[name].read_into(name, out, check)


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GaugeAuditError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise GaugeAuditError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise GaugeAuditError(f"{path}: expected a JSON object")
    return data


def all_finite(t: torch.Tensor) -> bool:
    """No NaN / ∞ entry (one min/max pass: NaN propagates through both, ∞ shows in one)."""
    return t.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(t))).all())


_EPS = {torch.float64: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}


@dataclass
class Checkpoint:
    """A checkpoint opened for reading; tensors stay on disk until asked for."""

    path: Path
    format: str  # "safetensors" | "gguf"
    arch: Arch  # the HF architecture (a GGUF llama file: LlamaForCausalLM)
    hf_config: dict  # its config.json (synthesised from the metadata for GGUF)
    cfg: Config
    source: HFDir | gguf_io.GGUFFile  # .entries, .get(name)
    links: list[Link]  # file tensors → project tensors
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.by_param = {p: link for link in self.links for p in link.params}
        self._resident: dict[str, torch.Tensor] = {}  # project-layout float64, for params(resident=True)
        self._validate()

    def release(self) -> None:
        """Forget the tensors kept by ``params(resident=True)`` (read again on the next access)."""
        self._resident.clear()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        entries = self.source.entries
        want = {name: shape for name, (shape, _) in FAMILIES[self.cfg.family].param_shapes(self.cfg).items()}
        linked = set()
        for link in self.links:
            for f in link.files:
                if f not in entries:
                    raise GaugeAuditError(
                        f"{self.path}: checkpoint lacks tensor {f} (needed for "
                        f"{', '.join(link.params)} of this {self.arch.name} config)"
                    )
                linked.add(f)
            metas = [torch.empty(entries[f][1], device="meta") for f in link.files]
            try:
                got = link.read(*metas)
            except RuntimeError:
                got = None
            for p, t in zip(link.params, got or [None] * len(link.params)):
                if t is None or tuple(t.shape) != tuple(want[p]):
                    shapes = ", ".join(f"{f} {list(entries[f][1])}" for f in link.files)
                    raise GaugeAuditError(
                        f"{self.path}: config/weight shape mismatch: {shapes} cannot give {p} "
                        f"of shape {list(want[p])} implied by the config"
                    )
        missing = sorted(set(want) - set(self.by_param))
        if missing:  # pragma: no cover - a mapping bug, not a user error
            raise GaugeAuditError(f"internal: no file tensor maps to {missing[0]}")
        for name in entries:
            if name in linked or self._ignored(name) or self._passthrough(name):
                continue
            raise GaugeAuditError(
                f"{self.path}: tensor {name} is not part of the {self.arch.name} layout the "
                "families represent (refusing rather than computing a different function)"
            )
        for name in linked:
            if not entries[name][0].is_floating_point:
                raise GaugeAuditError(f"{self.path}: tensor {name} has non-float dtype {entries[name][0]}")

    def _ignored(self, name: str) -> bool:
        return self.format == "safetensors" and re.fullmatch(self.arch.ignore, name) is not None

    def _passthrough(self, name: str) -> bool:
        return self.format == "safetensors" and re.fullmatch(self.arch.passthrough, name) is not None

    # ------------------------------------------------------------------ reading
    @property
    def name(self) -> str:
        return self.path.name

    def passthrough(self) -> list[str]:
        """Stored tensors outside the checked function, copied unchanged when writing (BERT's pooler)."""
        return [n for n in self.source.entries if self._passthrough(n)]

    def stored_dtype(self, name: str) -> torch.dtype:
        return self.source.entries[name][0]

    @property
    def storage_dtype(self) -> torch.dtype:
        """The coarsest floating dtype the function's weights are stored in (GGUF: float32, the
        dtype the quantized blocks dequantize to)."""
        dtypes = {self.stored_dtype(f) for link in self.links for f in link.files}
        return max(dtypes, key=lambda d: _EPS.get(d, 0))

    def raw(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A stored tensor as it is on disk (GGUF: dequantized to float32), or converted to ``dtype``
        (a large safetensors tensor chunk by chunk, without a whole stored copy beside it)."""
        if dtype is not None and self.format == "safetensors":
            assert isinstance(self.source, HFDir)  # a safetensors checkpoint is an HF directory
            return self.source.get(name, dtype)
        t = self.source.get(name)
        return t if dtype is None else t.to(dtype)

    def params(self, resident: bool = False, device: str | torch.device = "cpu", reuse: bool = False) -> LazyParams:
        """The project-layout parameters, float64, read on access.  ``resident`` keeps each one in
        memory after its first read (shared by every resident view of this checkpoint) — for
        repeated checks of a model that fits; otherwise at most a few stored tensors are cached
        and memory does not grow with the depth.  ``reuse``: the large reads take their storage
        from a :class:`~gauge_audit.runtime.StoragePool` (block i+1 in block i's pages) — for a
        consumer that drops each block before it reads the next and allocates little else between
        them (``check``'s forwards; a writer that holds other large buffers meanwhile would add the
        pool's free storages to its peak)."""
        shapes = {n: s for n, (s, _) in FAMILIES[self.cfg.family].param_shapes(self.cfg).items()}
        cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        pool = StoragePool() if reuse and not resident else None

        def stored(f: str, keep: bool) -> torch.Tensor:
            if f in cache:
                cache.move_to_end(f)
                return cache[f]
            t = self.source.get(f)
            if not all_finite(t):
                raise GaugeAuditError(f"{self.path}: tensor {f} contains NaN or infinite values")
            if keep:  # fused tensors (GPT-2 c_attn) are read once for Q, K and V
                cache[f] = t
                if len(cache) > 4:
                    cache.popitem(last=False)
            return t

        def load(name: str) -> torch.Tensor:
            if name in self._resident:
                return self._resident[name]
            link = self.by_param[name]
            t = self._read_direct(link, shapes[name], pool)
            if t is None:
                t = _widened_into_layout(link, shapes[name], stored)
            if t is None:
                out = link.read(*[stored(f, len(link.params) > 1).to(torch.float64) for f in link.files])
                t = out[link.params.index(name)].contiguous()
            if resident:
                self._resident[name] = t
            return t

        # resident tensors live on the CPU: on another device every access is a fresh copy
        return LazyParams(shapes, load, torch.float64, device, stable=resident and torch.device(device).type == "cpu")

    def _read_direct(self, link: Link, shape: tuple, pool: StoragePool | None = None) -> torch.Tensor | None:
        """A large one-file, one-tensor link read straight into its float64 result: the result is
        allocated in the project's layout, ``link.write`` gives the file's view of it (for
        nn.Linear the transpose), and the file is read into that view chunk by chunk — one float64
        copy instead of the stored bytes + a float64 copy + its re-laid-out copy (for an 8 B
        model's embedding or head 1 + 4.2 + 4.2 GB).  None where that view is not a view (the
        per-head re-layouts copy) or the source cannot read into one; the caller reads it whole."""
        if not (
            len(link.files) == len(link.params) == 1 and link.write is not None and hasattr(self.source, "read_into")
        ):
            return None
        f = link.files[0]
        dtype, fshape = self.source.entries[f]
        if math.prod(fshape) * 8 < DIRECT:  # small: the plain path costs nothing
            return None
        # every entry is written below
        out = pool.empty(shape) if pool is not None else torch.empty(shape, dtype=torch.float64)
        view = link.write(out)[0]
        if tuple(view.shape) != tuple(fshape) or view.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
            return None

        def finite(piece: torch.Tensor) -> None:
            if not all_finite(piece):
                raise GaugeAuditError(f"{self.path}: tensor {f} contains NaN or infinite values")

        self.source.read_into(f, view, finite)
        return out

    def float64_bytes(self) -> int:
        return 8 * sum(math.prod(s) for s, _ in FAMILIES[self.cfg.family].param_shapes(self.cfg).values())

    def fits_in_memory(self, fraction: float = 0.25) -> bool:
        """Is the float64 copy smaller than ``fraction`` of the memory available now (False where
        that is unknown)?"""
        avail = available_memory()
        return math.isfinite(avail) and self.float64_bytes() < fraction * avail

    def model(self, name: str | None = None, device: str = "cpu", resident: bool = False, reuse: bool = False) -> Model:
        """A :class:`~gauge_audit.models.Model` whose parameters are read on access (``resident``,
        ``reuse``: as :meth:`params`)."""
        params = self.params(resident, resolve_device(device), reuse)
        m = Model(name or self.name, self.cfg, params, FAMILIES[self.cfg.family])
        m._finite = True  # every stored tensor is checked for NaN / ∞ as it is read
        return m

    def describe(self) -> str:
        c = self.cfg
        return (
            f"{self.name}: {self.arch.name} ({self.format}) → {c.family}, d={c.d_model} L={c.n_layers} "
            f"h={c.n_heads} kv={c.n_kv_heads} d_head={c.d_head} d_ff={c.d_ff} vocab={c.vocab}"
            f"{' tied' if c.tied else ''}; stored as {str(self.storage_dtype).replace('torch.', '')}"
        )


@functools.lru_cache(maxsize=1)
def steady_memory() -> bool:
    """Keep the process's memory flat while blocks stream through it (glibc only; a no-op elsewhere).

    glibc raises its mmap threshold each time a large block is freed, up to 32 MiB, so the next
    layers' tensors (a few MiB each) come from the heap instead, and its fragmentation makes the
    resident set grow with the number of layers streamed.  A fixed 1 MiB threshold returns every
    such tensor to the system when it is freed (measured: the peak of transform on SmolLM2 and on
    a 2×-deeper copy then agree within 2 %, instead of 1.4×).  A process that keeps freed memory
    for reuse instead calls :func:`~gauge_audit.runtime.keep_freed_memory` after opening its
    checkpoints (compare)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, 1 << 20))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def layers_held(prefix: str, names) -> int:
    """How many layers a file holds: distinct i in names containing the prefix's last part with i
    ("model.layers.{i}." → "layers.{i}."; a bare model's files drop the leading part)."""
    last = prefix.split("{i}")[0].rstrip(".").rsplit(".", 1)[-1]
    pattern = re.compile(rf"(?:^|\.){re.escape(last)}\.(\d+)\.")
    return len({m.group(1) for n in names if (m := pattern.search(n))})


def open_checkpoint(path: str | Path) -> Checkpoint:
    """A Hugging Face directory (or its config.json) or a ``.gguf`` file."""
    steady_memory()
    path = Path(path)
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if not path.exists():
        raise GaugeAuditError(f"no such checkpoint: {path}")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise GaugeAuditError(f"{path}: no config.json (a Hugging Face checkpoint directory needs one)")
        hf = _json(path / "config.json")
        arch = arch_of(hf, ARCHS)
        try:
            cfg = arch.config(arch.name, hf)
        except GaugeAuditError as exc:
            raise GaugeAuditError(f"{path}: {exc}") from None
        source = HFDir(path)
        held = layers_held(arch.layer_prefix, source.entries)
        if held != cfg.n_layers:  # before anything of the config's depth is built
            raise GaugeAuditError(f"{path}: config.json says {cfg.n_layers} layers, the weights hold {held}")
        return Checkpoint(
            path, "safetensors", arch, hf, cfg, source, arch.links(cfg, source.entries.__contains__), list(arch.notes)
        )
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GaugeAuditError(f"{path}: neither a checkpoint directory nor a GGUF file")
    g = gguf_io.GGUFFile(path)
    hf = gguf_io.hf_config(g)
    cfg = gguf_io.config(g, hf)
    quants = ", ".join(f"{k} ×{v}" for k, v in sorted(g.quant_types().items()))
    if hf["architectures"][0] == "Gemma3ForCausalLM":
        return Checkpoint(
            path,
            "gguf",
            ARCHS["Gemma3ForCausalLM"],
            hf,
            cfg,
            g,
            gguf_io.gemma3_links(cfg),
            [f"GGUF tensors {quants}, dequantized to float32; norm weights stored as 1 + w"],
        )
    return Checkpoint(
        path,
        "gguf",
        ARCHS["LlamaForCausalLM"],
        hf,
        cfg,
        g,
        gguf_io.links(cfg),
        [f"GGUF tensors {quants}, dequantized to float32; Q/K rows un-permuted from llama.cpp's order"],
    )


def _widened_into_layout(link: Link, shape: tuple, stored: Callable[[str, bool], torch.Tensor]) -> torch.Tensor | None:
    """A one-file, one-tensor link whose project layout is a view of the file's (a transpose, a
    split into heads): the stored tensor widened to float64 straight into the project's layout —
    one float64 copy instead of a widened copy and its re-laid-out copy (Gemma 3 270M: 2 GB of
    fresh pages fewer to fault in).  The same values: widening is exact, and a copy moves them.
    None where ``link.write`` of the result is no view of it (the caller reads it the plain way)."""
    if not (len(link.files) == len(link.params) == 1 and link.write is not None):
        return None
    out = torch.empty(shape, dtype=torch.float64)  # pages are touched only by the copy below
    view = link.write(out)[0]
    if view.untyped_storage().data_ptr() != out.untyped_storage().data_ptr() or view.numel() != out.numel():
        return None
    t = stored(link.files[0], False)
    if tuple(view.shape) != tuple(t.shape):  # the plain read says what is wrong with it
        return link.read(t.to(torch.float64))[0].contiguous()
    view.copy_(t)
    return out
