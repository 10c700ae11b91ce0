"""The safetensors format, read lazily and written as a stream.

A file is ``u64 header length N`` · ``N bytes of JSON`` · ``data``; the header gives each
tensor's dtype, shape and ``[begin, end)`` byte range in the data section.  Reading
validates the header against the file *before* any tensor is touched (a truncated file or a
header that lies about sizes is one line, not a crash), then reads one tensor at a time with
a plain positioned read — not through a memory map, whose touched pages would stay in the
process's resident set and make its memory grow with the checkpoint.  Writing knows every
name, dtype and shape up front, so the header is written first and each tensor is written into
its range whenever it is ready — a transformed checkpoint streams to disk block by block.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path

import torch

from ...errors import GaugeAuditError

CODES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in CODES.items()}
MAX_HEADER = 100_000_000  # the format's own limit
CHUNK = 1 << 25  # bytes read (or written) at a time when converting or re-laying out a large tensor


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class SafetensorsFile:
    """One ``.safetensors`` file: validated header, tensors read on demand (a copy each time)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.spans: dict[str, tuple[int, int]] = {}
        self.entries = read_header(self.path, self.spans)  # name -> (dtype, shape)

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor, in its stored dtype or converted to ``dtype``; a large conversion is read in
        chunks straight into the result, so the stored bytes are never held whole next to it."""
        stored, shape = self.entries[name]
        if dtype is not None and dtype != stored and len(shape) and math.prod(shape) * _itemsize(stored) > CHUNK:
            out = torch.empty(shape, dtype=dtype)
            self.read_into(name, out)
            return out
        begin, end = self.spans[name]
        buf = bytearray(end - begin)
        try:
            with open(self.path, "rb") as f:
                f.seek(begin)
                got = f.readinto(buf)
        except OSError as exc:
            raise GaugeAuditError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if got != len(buf):
            raise GaugeAuditError(f"{self.path}: truncated while reading tensor {name}")
        if not buf:
            t = torch.empty(shape, dtype=stored)
        else:
            t = torch.frombuffer(buf, dtype=stored).reshape(shape)
        return t if dtype is None else t.to(dtype)

    def read_into(self, name: str, out: torch.Tensor, check: Callable[[torch.Tensor], None] | None = None) -> None:
        """Fill ``out`` (the tensor's shape, any dtype and strides — e.g. the transpose of a
        contiguous result) from the file, ≤ CHUNK bytes of rows at a time; ``check`` sees each
        chunk as stored (a NaN test there reads a quarter of the bytes of the float64 result)."""
        stored, shape = self.entries[name]
        if tuple(out.shape) != tuple(shape) or not len(shape):
            raise ValueError(f"read_into {name}: shape {tuple(out.shape)} for a stored {tuple(shape)}")
        begin, end = self.spans[name]
        rows = shape[0]
        row_bytes = (end - begin) // rows if rows else 0
        step = max(1, CHUNK // max(row_bytes, 1))
        buf = bytearray(min(rows, step) * row_bytes)
        try:
            with open(self.path, "rb") as f:
                f.seek(begin)
                for r0 in range(0, rows, step):
                    r1 = min(rows, r0 + step)
                    view = memoryview(buf)[: (r1 - r0) * row_bytes]
                    if f.readinto(view) != len(view):
                        raise GaugeAuditError(f"{self.path}: truncated while reading tensor {name}")
                    if len(view):
                        piece = torch.frombuffer(view, dtype=stored).reshape((r1 - r0, *shape[1:]))
                        if check is not None:
                            check(piece)
                        out[r0:r1].copy_(piece)
        except OSError as exc:
            raise GaugeAuditError(f"cannot read {self.path}: {exc.strerror or exc}") from None


def read_header(path: Path, spans: dict | None = None) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Every tensor's (dtype, shape), after checking that the header describes the file exactly;
    ``spans`` (if given) receives each tensor's absolute [begin, end) byte range."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise GaugeAuditError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            n = struct.unpack("<Q", head)[0]
            if n > min(MAX_HEADER, size - 8):
                raise GaugeAuditError(
                    f"{path}: truncated or corrupt safetensors file (header length {n} exceeds the file's {size} bytes)"
                )
            raw = f.read(n)
    except OSError as exc:
        raise GaugeAuditError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise GaugeAuditError(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise GaugeAuditError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data = size - 8 - n
    out, ranges = {}, []
    for name, info in header.items():
        try:
            code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise GaugeAuditError(f"{path}: malformed header entry for tensor {name}") from None
        if code not in CODES:
            raise GaugeAuditError(f"{path}: tensor {name} has unsupported dtype {code!r}")
        if not (
            isinstance(shape, list)
            and all(isinstance(s, int) and s >= 0 for s in shape)
            and isinstance(begin, int)
            and isinstance(end, int)
            and 0 <= begin <= end
        ):
            raise GaugeAuditError(f"{path}: malformed shape or offsets for tensor {name}")
        need = math.prod(shape) * _itemsize(CODES[code])
        if end - begin != need:
            raise GaugeAuditError(
                f"{path}: header gives tensor {name} ({code}, shape {shape}) {end - begin} bytes; it needs {need}"
            )
        if end > data:
            raise GaugeAuditError(
                f"{path}: truncated safetensors file (tensor {name} ends at byte {end} of a {data}-byte data section)"
            )
        out[name] = (CODES[code], tuple(shape))
        ranges.append((begin, end, name))
        if spans is not None:
            spans[name] = (8 + n + begin, 8 + n + end)
    ranges.sort()
    for (_, e0, n0), (b1, _, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            raise GaugeAuditError(f"{path}: header gives tensors {n0} and {n1} overlapping byte ranges")
    return out


class SafetensorsWriter:
    """Write a safetensors file whose tensors arrive one at a time, in any order.

    ``plan`` maps each name to (dtype, shape); offsets follow the plan's order.  ``close``
    fails if a planned tensor was never written.
    """

    def __init__(self, path: Path, plan: dict[str, tuple[torch.dtype, tuple]], metadata: dict | None = None):
        self.path, self.plan = Path(path), plan
        header, offset, self.offsets = {}, 0, {}
        for name, (dtype, shape) in plan.items():
            nbytes = math.prod(shape) * _itemsize(dtype)
            header[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self.offsets[name] = offset
            offset += nbytes
        header["__metadata__"] = metadata or {"format": "pt"}
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
        self.base = 8 + len(text)
        self.written: set[str] = set()
        self._f = open(self.path, "wb")
        self._f.write(struct.pack("<Q", len(text)) + text)
        self._f.truncate(self.base + offset)

    def write(self, name: str, t: torch.Tensor) -> None:
        dtype, shape = self.plan[name]
        if tuple(t.shape) != tuple(shape):
            raise GaugeAuditError(f"tensor {name} has shape {tuple(t.shape)}, the plan says {tuple(shape)}")
        t = t.detach()
        self._f.seek(self.base + self.offsets[name])
        # rows at a time: converting / re-laying out a large tensor whole would hold copies of it
        rows = t.shape[0] if t.dim() else 1
        row_bytes = (t.numel() // rows if rows else 0) * max(_itemsize(dtype), t.element_size())
        step = max(1, CHUNK // max(row_bytes, 1)) if t.dim() else 1
        for r0 in range(0, rows, step):
            piece = t[r0 : r0 + step] if t.dim() else t
            data = piece.to("cpu", dtype).contiguous().reshape(-1).view(torch.uint8).numpy()
            self._f.write(memoryview(data))  # type: ignore[arg-type]  # numpy stub: ndarray is a Buffer from 3.12
        self.written.add(name)

    def close(self) -> None:
        self._f.close()
        missing = [n for n in self.plan if n not in self.written]
        if missing:
            raise GaugeAuditError(f"{self.path}: {len(missing)} planned tensor(s) never written, e.g. {missing[0]}")

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            self._f.close()
