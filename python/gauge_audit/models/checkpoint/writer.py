"""Project layout → a Hugging Face checkpoint directory, streamed block by block, atomically.

    with atomic_dir(out) as tmp:           # nothing appears at ``out`` unless the block succeeds
        write_hf(tmp, ckpt, cfg, params)   # config.json + model.safetensors (+ tokenizer files)

``params`` may be any mapping in the project's layout — a lazy one (:class:`LazyParams`, or an
action applied block by block) is read one link at a time, in block order, so writing needs
memory for one block and the embeddings only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from ...errors import GaugeAuditError
from ..config import Config
from ..families import FAMILIES
from . import Checkpoint
from .hf import Arch, Link
from .safetensors_file import SafetensorsWriter

# Files a tokenizer may consist of; copied verbatim from a Hugging Face directory.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


def refuse_existing(out: Path, force: bool = False, hint: str = "") -> None:
    """Fail before any work when ``out`` cannot be written: every command that writes a directory
    refuses an existing path the same way (``force``: an existing directory may be replaced, a
    file never).  ``hint`` ends the message (e.g. how to replace it)."""
    out = Path(out)
    if out.exists() and not force:
        raise GaugeAuditError(f"{out} already exists (refusing to overwrite{hint})")
    if out.exists() and not out.is_dir():
        raise GaugeAuditError(f"{out} exists and is not a directory")


@contextlib.contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """A temporary directory next to ``out``, renamed to ``out`` when the block succeeds and
    removed when it fails; ``out`` must not exist."""
    out = Path(out)
    refuse_existing(out)
    if not out.parent.is_dir():
        raise GaugeAuditError(f"{out.parent} is not a directory")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would otherwise survive the rename
    try:
        yield tmp
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def output_links(arch: Arch, cfg: Config) -> list[Link]:
    """The HF tensors of ``cfg`` in ``arch``'s file layout (untied: with ``lm_head``; Mixtral
    experts per expert, as ``save_pretrained`` writes them)."""
    return arch.links(cfg, lambda name: False)


def hf_config(ckpt: Checkpoint, cfg: Config, dtype: torch.dtype) -> dict:
    """The input's config.json with the written dtype and tying."""
    out = dict(ckpt.hf_config)
    name = str(dtype).replace("torch.", "")
    out["dtype"] = name
    if "torch_dtype" in out:
        out["torch_dtype"] = name
    if cfg.unembed:
        out["tie_word_embeddings"] = bool(cfg.tied)
    return out


def plan(ckpt: Checkpoint, cfg: Config, dtype: torch.dtype | None) -> dict[str, tuple[torch.dtype, tuple]]:
    """Every tensor the output holds: name → (dtype, shape).  ``dtype=None`` keeps each tensor's
    stored dtype (float32 for tensors a GGUF file held quantized)."""
    shapes = FAMILIES[cfg.family].param_shapes(cfg)
    out = {}
    for link in output_links(ckpt.arch, cfg):
        assert link.write is not None  # every link of an HF layout writes (only GGUF's read alone)
        metas = link.write(*[torch.empty(shapes[p][0], device="meta") for p in link.params])
        for f, t in zip(link.files, metas):
            out[f] = (dtype or _stored(ckpt, f), tuple(t.shape))
    for name in ckpt.passthrough():
        out[_passthrough_name(name)] = (dtype or ckpt.stored_dtype(name), ckpt.source.entries[name][1])
    return out


def _stored(ckpt: Checkpoint, name: str) -> torch.dtype:
    entries = ckpt.source.entries
    if ckpt.format == "safetensors" and name in entries:
        return entries[name][0]
    return torch.float32


def _passthrough_name(name: str) -> str:
    return re.sub(r"^bert\.", "", name)  # the BertModel layout has no prefix


def _write_link(w: SafetensorsWriter, link: Link, params: Mapping) -> None:
    """One link's file tensors; a function of its own so that nothing of them outlives the call
    (a loop variable would keep an 8 B model's 4.2 GB float64 embedding alive while the next
    block is computed)."""
    assert link.write is not None  # every link of an HF layout writes (only GGUF's read alone)
    for f, t in zip(link.files, link.write(*[params[p] for p in link.params])):
        w.write(f, t)


def write_hf(
    out: Path,
    ckpt: Checkpoint,
    cfg: Config,
    params: Mapping,
    dtype: torch.dtype | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write ``params`` (project layout, config ``cfg``) as ``out/config.json`` +
    ``out/model.safetensors`` and copy the tokenizer files of an HF input.  Returns a summary
    (tensor count, dtypes, bytes)."""
    out = Path(out)
    layout = plan(ckpt, cfg, dtype)
    links = output_links(ckpt.arch, cfg)
    with SafetensorsWriter(out / "model.safetensors", layout) as w:
        for k, link in enumerate(links, 1):
            _write_link(w, link, params)
            if progress is not None:
                progress(k, len(links))
        for name in ckpt.passthrough():
            w.write(_passthrough_name(name), ckpt.raw(name))
    written = {d for d, _ in layout.values()}
    coarsest = max(written, key=lambda d: torch.finfo(d).eps)
    (out / "config.json").write_text(json.dumps(hf_config(ckpt, cfg, coarsest), indent=2, sort_keys=True) + "\n")
    copied = []
    if ckpt.format == "safetensors":
        for name in TOKENIZER_FILES:
            if (ckpt.path / name).is_file():
                shutil.copyfile(ckpt.path / name, out / name)
                copied.append(name)
    return {
        "tensors": len(layout),
        "dtype": str(coarsest).replace("torch.", ""),
        "bytes": (out / "model.safetensors").stat().st_size,
        "copied_files": copied,
    }
