"""Device, dtype and random-generator selection shared by every checker."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os

import torch

from .errors import GaugeAuditError

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when a GPU is visible and the CPU otherwise."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise GaugeAuditError("--device cuda requested but no CUDA device is available")
        return torch.device("cuda")
    raise GaugeAuditError(f"unknown device {name!r} (choose auto, cpu or cuda)")


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise GaugeAuditError(f"unknown dtype {name!r} (choose {', '.join(DTYPES)})") from None


def generator(seed: int) -> torch.Generator:
    """A CPU generator: draws are made on the CPU in float64 and then moved, so the
    same seed gives the same numbers on every device."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g


def require_transformers():
    """The transformers module (an optional dependency), its progress bars and warnings off."""
    try:
        import transformers
    except ImportError:
        raise GaugeAuditError("this needs the transformers package (pip install 'gauge-audit[hf]')") from None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def eps(dtype: torch.dtype) -> float:
    """Unit roundoff convention used throughout: machine epsilon ``torch.finfo(dtype).eps``."""
    return float(torch.finfo(dtype).eps)


# Thread policy.  torch starts with one intra-op thread per core; each phase chooses instead:
#
# * one thread for work made of many small operations (tiny models, one factorisation per head,
#   forwards of models up to a few hundred million parameters on a few dozen tokens): on a busy
#   CPU the hand-offs and spin-waits between threads dominate such work, e.g. the default audit
#   took 632 s wall / 250 s CPU with two threads at a load of 6 and 105 s / 40 s on one;
#   MiniLM's canonicalisation 43 s with two threads at a load of 6 and 1.5 s on one
#   (``benchmarks/bench_gauge_fix.py`` prints the ratio at the current load);
# * every thread torch was given (``OMP_NUM_THREADS`` or the cores) for large dense work — the
#   nullity measurement from P ≥ 2048 parameters (Jacobian blocks of ~16 M entries, the
#   certificate's Gram and Cholesky, the dense path's QR and SVD), forwards of billion-parameter
#   checkpoints — whose kernels keep each thread busy for milliseconds between hand-offs.
#
# One thread also makes results independent of the machine: torch splits long reductions (a
# sum, a norm) and LAPACK its factorisations (QR, SVD, Cholesky) across threads, which changes
# their last bits, so the audit's report would otherwise differ between OMP_NUM_THREADS=1 and
# 2.  The audit therefore runs under :func:`reproducible`, which no phase inside can raise.

DEFAULT_THREADS = torch.get_num_threads()  # what torch chose at import (OMP_NUM_THREADS or the cores)
# Dense work on matrices with at least this many columns runs at every thread (see above).
DENSE_KERNEL_MIN = 2048
# Above this many parameters a model's forward is dominated by large matrix products (d ≥ 2048:
# e.g. 16 tokens × 4096 × 14 336 per FFN matrix) and gains from every core.
LARGE_MODEL_PARAMS = 500_000_000


_pinned = False  # inside reproducible(): every phase runs on one thread


@contextlib.contextmanager
def threads(n: int):
    """Run torch on ``n`` intra-op threads inside the block (the previous setting is restored);
    one inside :func:`reproducible`."""
    old = torch.get_num_threads()
    torch.set_num_threads(1 if _pinned else max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def reproducible():
    """One thread for everything inside the block, phases that would choose more included:
    results that do not depend on the thread count (the audit's report)."""
    global _pinned
    was, _pinned = _pinned, True
    try:
        with threads(1):
            yield
    finally:
        _pinned = was


def one_thread():
    """One intra-op thread inside the block: small operations, reproducible reductions (see the
    thread policy above)."""
    return threads(1)


def dense_threads(n: int):
    """Threads for dense work on matrices of ``n`` columns: every thread torch was given from
    :data:`DENSE_KERNEL_MIN` on, one below (see the thread policy above)."""
    return threads(DEFAULT_THREADS if n >= DENSE_KERNEL_MIN else 1)


def model_threads(n_params: int):
    """Threads for forwards of a model with ``n_params`` parameters: one for small models, every
    thread torch was given for billion-parameter ones (see the thread policy above)."""
    return threads(DEFAULT_THREADS if n_params > LARGE_MODEL_PARAMS else 1)


# torch's LU on a stack of matrices (linalg.solve, inv, det, slogdet, lu_factor with batch
# dimensions) runs LAPACK's getrf for several matrices of the stack at once on its threads, and
# MKL's row swaps are not safe so: from about 150 rows on, with more than one thread, it raises
# "Pivots given to lu_solve must all be greater or equal to 1" after MKL's "Parameter 6 was
# incorrect on entry to DLASWP", or returns wrong numbers without a word (a stack of four 256×256
# solves: residual 1e11; Gemma 3's 256-wide value heads).  One thread for the stack is correct,
# and a single matrix is; these are the project's LU calls.
def _stacked(a: torch.Tensor):
    return threads(1) if a.dim() > 2 else contextlib.nullcontext()


def stacked_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.solve(a, b)``, correct on a stack of matrices whatever the thread count."""
    with _stacked(a):
        return torch.linalg.solve(a, b)


def stacked_inv(a: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.inv(a)``, correct on a stack of matrices whatever the thread count."""
    with _stacked(a):
        return torch.linalg.inv(a)


def stacked_det(a: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.det(a)``, correct on a stack of matrices whatever the thread count."""
    with _stacked(a):
        return torch.linalg.det(a)


def stacked_lu_factor(a: torch.Tensor):
    """``torch.linalg.lu_factor(a)``, correct on a stack of matrices whatever the thread count."""
    with _stacked(a):
        return torch.linalg.lu_factor(a)


# torch.linalg.matrix_exp of one matrix picks a Taylor degree by the norm, and its degree-8
# polynomial has a wrong x⁷ coefficient (pytorch/pytorch#196592): in float64 a 1-norm between about
# 0.01 and 0.05 loses up to 9·10⁴ ε (exp(Cᵀ)ᵀ·exp(−C) ≠ I by 10⁻¹¹), which a canonical form's Newton
# step turns into a function change of 10³ ε.  Stacks of matrices take another path.  This one is
# scaling and squaring with a Taylor degree that bounds its own truncation, tested against mpmath.
def above_rounding(A: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Which singular values ``s`` of ``A`` stand above its rounding, max(m, n)·ε·s₀: its numerical rank."""
    return s > max(A.shape) * torch.finfo(A.dtype).eps * (float(s[0]) if s.numel() else 0.0)


def matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """exp(a) of a square matrix or a stack of them: b = a/2^s with ‖b‖₁ ≤ 1/2, its Taylor series
    to degree m + 2, m the first degree whose remainder bound ‖b‖^(m+1)/(m+1)!·e^‖b‖ is below ε/8
    (m ≤ 15 at ‖b‖₁ = 1/2), by Horner, squared s times.  The two degrees more keep the first and
    second derivatives as accurate as the value (at a = 0 the value needs degree 0, its derivative
    degree 1 and a Newton step's Hessian degree 2).  Products and sums only, so forward- and
    reverse-mode derivatives pass through it."""
    norm = float(a.detach().abs().sum(-2).amax()) if a.numel() else 0.0
    s = math.ceil(math.log2(norm / 0.5)) if norm > 0.5 else 0
    b = a / 2**s
    nb, m, term = norm / 2**s, 0, 1.0
    while True:  # term = ‖b‖^(m+1)/(m+1)!
        term *= nb / (m + 1)
        if term * math.exp(nb) <= eps(a.dtype) / 8:
            break
        m += 1
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    e = eye
    for k in range(m + 2, 0, -1):
        e = eye + (b @ e) / k
    for _ in range(s):
        e = e @ e
    return e


# A product a·b formed on the way by one step and needed again by the next (one slot; see
# :func:`remember_product`).
_KNOWN_PRODUCT: list[tuple] = []


def _operand_key(t: torch.Tensor) -> tuple:
    # the same numbers: the same storage, view and in-place version (a detached view, as
    # actions take their operands, shares all three with its tensor)
    return (t.data_ptr(), t.dtype, t.device, tuple(t.shape), t.stride(), t._version)


def remember_product(a: torch.Tensor, b: torch.Tensor, ab: torch.Tensor) -> None:
    """Keep ``ab`` = a·b, computed by the caller on the way, for the next :func:`matmul` of these
    very operands.  The gauge fixing's stream step forms W_E·V for the third moments of its
    axes, then rotates W_E by R = V·diag(±1): W_E·R is those columns signed (a sign flips no
    rounding), a product of the embedding's size (SmolLM2: 33 GFLOP) not formed twice."""
    # the operands are held too, so that no other tensor takes their memory (and key) meanwhile
    _KNOWN_PRODUCT[:] = [(_operand_key(a), _operand_key(b), ab, a, b)]


def forget_products() -> None:
    """Drop a remembered product that was not used (it holds memory of an operand's size)."""
    _KNOWN_PRODUCT.clear()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, or the product :func:`remember_product` kept for these operands, unchanged since
    (handed out once); inside :func:`wide_products` a large one on every thread."""
    if _KNOWN_PRODUCT and _KNOWN_PRODUCT[0][:2] == (_operand_key(a), _operand_key(b)):
        return _KNOWN_PRODUCT.pop()[2]  # the operands held with it are let go
    if _wide and a.dim() == b.dim() == 2 and min(a.shape[0], a.shape[1], b.shape[1]) >= DENSE_KERNEL_MIN:
        with threads(DEFAULT_THREADS):
            return a @ b
    return a @ b


_wide = False


@contextlib.contextmanager
def wide_products():
    """Inside the block :func:`matmul` runs a product of matrices whose three sizes are all at
    least :data:`DENSE_KERNEL_MIN` on every thread, whatever the phase chose.  The BLAS torch
    ships splits a large product's output among its threads, each entry one dot product summed
    in the same order, so the result does not depend on the thread count — unlike a reduction or
    a factorisation (measured bit-equal at 1 and 2 threads; ``tests/test_by_runs.py`` checks it).
    For a model canonicalised one run of blocks at a time (:mod:`gauge_audit.gauge_fix.by_runs`),
    where the stream rotation's products are nearly all the flops and each keeps a thread busy
    for a second."""
    global _wide
    was, _wide = _wide, True
    try:
        yield
    finally:
        _wide = was


def keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for reuse instead of returning it to the system: the
    gauge-fixing steps and the audit's checks on real checkpoints allocate and free block-sized
    float64 tensors (megabytes) thousands of times,
    and with the defaults (a freed top of heap above 2× the adaptive mmap threshold is trimmed)
    every one of them is page-faulted in afresh — on SmolLM2 over 20 GB of fresh pages for
    compare's six probes, half its CPU time in the kernel (the default audit: 13 s of kernel time → 8 s).  Chunks up to 32 MiB come from the heap,
    which is never trimmed; larger ones are still mapped and unmapped.  No effect elsewhere.
    Opening a checkpoint afterwards lowers the mmap threshold to 1 MiB again
    (:func:`~gauge_audit.models.checkpoint.steady_memory`): call this after opening them where
    the process should keep its freed memory (compare on SmolLM2: 24.5 s in the kernel
    otherwise, 7 s).  The audit's report.json is measured with the order the audit has always
    used (kept, then lowered when its real checkpoints open): the last bits of one LAPACK least
    squares in its wiki-align-models experiment move with the allocation pattern."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (its maximum on 64-bit glibc)
    mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD: never trim
    mallopt(-2, 64 << 20)  # M_TOP_PAD: grow the heap 64 MiB at a time (pages touched only when used)


def release_freed_memory() -> None:
    """Return the heap's free pages to the system once (glibc's ``malloc_trim``), where
    :func:`keep_freed_memory` keeps them otherwise: after a phase whose block-sized temporaries
    are not needed again before a larger peak (compare on SmolLM2: A's whole canonicalisation
    leaves a third of a GB free in the heap, which B's first run of blocks, with the
    vocabulary-sized embeddings mapped on their own, would otherwise add to); and before a fork,
    which copies the page table of every resident page, the free ones kept for reuse included (a
    process holding 4 GB of free heap forked a helper in 80 ms of kernel time, 15 ms after the
    trim; a command forks while it holds little, where the trim costs nothing).  No effect elsewhere."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


class StoragePool:
    """Float64 tensors of recurring sizes on storages that no tensor uses any more, handed out again
    instead of fresh ones.

    glibc maps every allocation above 32 MiB afresh and unmaps it when it is freed, so each block of
    a streamed checkpoint (an 8 B model's FFN matrices are 470 MB in float64) is page-faulted in anew
    on every read: a third of ``check``'s time at 8 B is the kernel zeroing those pages.  Blocks of
    one model repeat their shapes, so the storages of block i, once block i's tensors are gone, can
    take block i+1's.  A storage is free when nothing but the pool refers to it (its use count is the
    pool's one).  A request that no free storage fits first releases every free storage: memory held
    beyond what is in use is then at most the buffers the next requests of the same sizes take, and
    a change of pattern (from the blocks to the vocabulary-sized head) returns them to the system.
    Where the use count cannot be read (another torch), every request is a fresh tensor."""

    def __init__(self) -> None:
        self._storages: list = []
        self._count = getattr(torch._C, "_storage_Use_Count", None)

    def _free(self, s) -> bool:
        return self._count is not None and self._count(s._cdata) == 1

    def empty(self, shape: tuple) -> torch.Tensor:
        """An uninitialised float64 tensor of ``shape`` (its contents are whatever was there)."""
        nbytes = 8 * math.prod(shape)
        if self._count is None:
            return torch.empty(shape, dtype=torch.float64)
        for s in self._storages:
            if s.nbytes() == nbytes and self._free(s):
                return torch.empty(0, dtype=torch.float64).set_(s).view(shape)
        self._storages = [s for s in self._storages if not self._free(s)]
        t = torch.empty(shape, dtype=torch.float64)
        self._storages.append(t.untyped_storage())
        return t

    def clear(self) -> None:
        self._storages = []


class Forked:
    """``fn(*args)`` in a forked child process while the caller goes on (work that does not need
    the caller's later state: on 2 cores it overlaps); :meth:`result` returns its value, which
    travels back by value as a plain pickle, or raises its error.  Where the platform cannot fork
    (or for CUDA work, which cannot be forked once initialised) it runs in :meth:`result` instead."""

    def __init__(self, fn, *args, fork: bool = True):
        import multiprocessing

        self._fn, self._args, self._proc = fn, args, None
        if fork and "fork" in multiprocessing.get_all_start_methods():
            release_freed_memory()  # a fork copies the page table of every resident page, free ones too
            mp = multiprocessing.get_context("fork")
            self._recv, send = mp.Pipe(duplex=False)
            self._proc = mp.Process(target=_forked_main, args=(send, fn, args), daemon=True)
            self._proc.start()
            send.close()

    @property
    def forked(self) -> bool:
        """Whether ``fn`` runs in a helper process (else in :meth:`result`)."""
        return self._proc is not None

    def cancel(self) -> None:
        """End the helper if it still runs (its result not wanted: after an error in the caller);
        nothing where it was collected or never forked."""
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join()

    def result(self):
        import pickle

        if self._proc is None:
            return self._fn(*self._args)
        try:
            data = self._recv.recv_bytes()
        except EOFError:
            self._proc.join()
            raise GaugeAuditError(
                f"a helper process ended with exit code {self._proc.exitcode} before its work was done (out of memory?)"
            ) from None
        finally:
            self._recv.close()
        self._proc.join()
        kind, value = pickle.loads(data)
        if kind == "error":
            raise GaugeAuditError(*value)
        if kind == "crash":
            raise RuntimeError(f"a helper process failed:\n{value}")
        return value


def _forked_main(send, fn, args) -> None:
    import pickle
    import traceback

    try:
        payload = ("ok", fn(*args))
    except GaugeAuditError as exc:  # bad input: the caller reports it in one line per problem
        payload = ("error", exc.lines)
    except BaseException:
        payload = ("crash", traceback.format_exc())
    send.send_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    send.close()


def size_text(b: float) -> str:
    """A number of bytes in decimal units, three significant digits (58.5 kB, 64.2 GB)."""
    for unit, f in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b / 1e3:.3g} kB"


def available_memory() -> float:
    """Bytes of memory available to a new allocation now (Linux: MemAvailable of /proc/meminfo;
    elsewhere the OS's count of available pages), or +inf if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf
