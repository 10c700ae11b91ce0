"""``gauge-audit canonicalize``: the canonical representative of a model's symmetry orbit."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..actions.elements import save_element
from ..errors import GaugeAuditError
from ..gauge_fix import canonicalize, function_check
from ..models import Config, build, config_of, gemma3, minilm, parameter_count, smollm2
from ..models.checkpoint import Checkpoint, all_finite, open_checkpoint
from ..models.checkpoint.writer import atomic_dir, refuse_existing
from ..models.derived import needs_derivation
from ..models.lazy import LazyParams
from ..progress import echo, ticker
from ..runtime import available_memory, model_threads, resolve_dtype, size_text

_CHECKPOINT_SUFFIXES = (".gguf", ".safetensors", ".json", ".bin", ".pt")
# Built-in names that are real checkpoints: canonicalised and compared as such (their storage
# dtype, written back in their own file format).
_PACKAGED = {"minilm": minilm.checkpoint, "smollm2": smollm2.checkpoint, "gemma3": gemma3.checkpoint}


def looks_like_path(name: str) -> bool:
    return os.sep in name or name.endswith(_CHECKPOINT_SUFFIXES) or os.path.exists(name)


@dataclass
class Source:
    """A model to canonicalise or compare: its parameters in memory (float64 unless a built-in
    was rounded on purpose), the dtype it was stored in, and its checkpoint when it has one."""

    label: str
    cfg: Config
    params: Mapping
    storage_dtype: torch.dtype
    checkpoint: Checkpoint | None = None


def _gauge_fixable(cfg: Config, label: str | None = None) -> Config:
    """The configuration, or a one-line refusal naming a feature whose gauge group gauge fixing
    does not yet know (its conditions would be the wrong ones).  Known: QK-norms (head, full), a
    partial rotary, normed sublayer outputs, sandwich norms with Gemma's embedding scale, (1 + w)
    weights and soft-capping, RoPE scaling tables, sliding windows, a parallel residual read through
    norms, multi-head latent attention with DeepSeek's mixture of experts."""
    for feature, used in (
        # the bias chain's stretches of a norm-free stream are derived for sublayers in sequence
        ("a parallel residual without norms", cfg.parallel_residual and cfg.norm == "none"),
    ):
        if used:
            raise GaugeAuditError(f"{label + ': ' if label else ''}gauge fixing does not support {feature} yet")
    return cfg


def load_source(
    name: str,
    seed: int = 0,
    checkpoint: bool = False,
    native: bool = False,
    resident: bool = True,
    fixable: bool = True,
) -> Source:
    """A built-in model (the tiny families by name and seed) or a checkpoint (a path, or the
    packaged ``minilm`` / ``smollm2``) read into memory in float64.  ``native``: a checkpoint's
    tensors in the dtype they are stored in instead (the same values in half or a quarter of the
    memory; every gauge-fixing step converts to float64 as it reads), and with ``resident=False``
    read from the file on every access (:class:`StoredParams`) instead of held.  ``fixable``: refuse
    in one line what gauge fixing does not handle (``align`` moves such models too: ``False``)."""
    if checkpoint or looks_like_path(name):
        ckpt = open_checkpoint(name)
    elif name in _PACKAGED:
        ckpt = _PACKAGED[name]()
    else:
        cfg = config_of(name)  # unknown names: one line
        if fixable:
            _gauge_fixable(cfg, name)
        m = build(name, seed=seed, device="cpu")
        return Source(f"{name} (seed {seed})", m.cfg, m.params, torch.float64)
    if fixable:
        _gauge_fixable(ckpt.cfg, ckpt.name)
    lazy = StoredParams(ckpt) if native else ckpt.params()
    if native and not resident:
        return Source(ckpt.describe(), ckpt.cfg, lazy, ckpt.storage_dtype, ckpt)
    tick = ticker(f"read {ckpt.name}", unit="tensor")
    params = {}
    for i, k in enumerate(lazy, 1):
        params[k] = lazy[k]
        if tick:
            tick(i, len(lazy))
    return Source(ckpt.describe(), ckpt.cfg, params, ckpt.storage_dtype, ckpt)


def float64_shortfall(src: Source) -> tuple[int, float] | None:
    """(bytes of the float64 copy, bytes of memory available now) where the copy does not fit;
    None where it does, or for a built-in model (built in memory already).  The float64 copy is a
    lower bound of a whole-model command's peak (SmolLM2's is 1.3× it): past the available memory
    the kernel kills the process after minutes of reading, or the machine swaps."""
    if src.checkpoint is None:
        return None
    need, have = src.checkpoint.float64_bytes(), available_memory()
    return (need, have) if need > have else None


def require_float64_memory(src: Source, command: str, why: str = "") -> None:
    """Refuse in one line, before any work, a checkpoint whose float64 copy does not fit in the
    memory available now (:func:`float64_shortfall`): the whole-model pipeline of ``canonicalize``
    and ``compare`` holds a model in float64 (8 bytes a parameter: 64 GB for an 8 B model), which
    their one-run-at-a-time paths avoid where the architecture allows.  ``why``: the end of the
    message."""
    short = float64_shortfall(src)
    if short is not None:
        assert src.checkpoint is not None  # a shortfall is measured for checkpoints only
        raise GaugeAuditError(
            f"{command} holds the whole model in float64: {size_text(short[0])} for {src.checkpoint.name}, "
            f"and {size_text(short[1])} of memory is available now"
            + (why or " (check, transform and canonicalize stream a model block by block)")
        )


def by_runs(src: Source, command: str, what: str, doing: str, asked: bool) -> bool:
    """Whether ``command`` goes one run of blocks at a time: asked for, or ``src``'s float64 copy
    exceeds the memory available now (said on stderr: stdout may be the JSON report); refused in one
    line where the architecture does not allow it (``what``, ``doing``: the work, for the messages)."""
    short = float64_shortfall(src)
    if not asked and short is None:
        return False
    from ..gauge_fix.by_runs import streamable

    why = streamable(src.cfg)
    if why is not None:
        if short is not None:
            require_float64_memory(src, command, f" (one run of blocks at a time: not for {why})")
        raise GaugeAuditError(f"--by-runs: {what} one run of blocks at a time does not support {why}")
    if short is not None:
        print(
            f"the float64 copy ({size_text(short[0])}) exceeds the available memory ({size_text(short[1])}): "
            f"{doing} one run of blocks at a time",
            file=sys.stderr,
            flush=True,
        )
    return True


class StoredParams(LazyParams):
    """A checkpoint's project-layout tensors in the dtype they are stored in (GGUF: float32, what
    its blocks dequantize to), read on access.  Exact: the file-to-project links only reshape,
    transpose, split and stack (:mod:`gauge_audit.models.checkpoint.hf`); a link over files of
    different dtypes reads them in the finest of them."""

    def __init__(self, ckpt: Checkpoint):
        from ..models import param_shapes

        shapes = {n: s for n, (s, _) in param_shapes(ckpt.cfg).items()}
        super().__init__(shapes, self._read, ckpt.storage_dtype)
        self.ckpt = ckpt
        self._last: tuple = (None, None)

    def __getitem__(self, name: str) -> torch.Tensor:  # no conversion to one dtype: each as stored
        if name not in self.shapes:
            raise KeyError(name)
        return self._read(name)

    def _read(self, name: str) -> torch.Tensor:
        link = self.ckpt.by_param[name]
        if self._last[0] is not link:  # a fused file tensor (GPT-2 c_attn) is read once for its parts
            files = []
            for f in link.files:
                t = self.ckpt.raw(f)
                if not all_finite(t):
                    raise GaugeAuditError(f"{self.ckpt.path}: tensor {f} contains NaN or infinite values")
                files.append(t)
            dtype = max((t.dtype for t in files), key=lambda d: torch.finfo(d).bits)
            self._last = (None, None)
            self._last = (link, link.read(*[t.to(dtype) for t in files]))
        return self._last[1][link.params.index(name)].contiguous()

    def forget(self) -> None:
        """Let go of the last read held for the next (a vocabulary-sized head stored transposed is
        held as read beside the project-layout copy handed out: 1 GB each at Llama-3-8B's)."""
        self._last = (None, None)


def register(sub) -> None:
    p = sub.add_parser(
        "canonicalize",
        help="the canonical representative of a model's symmetry orbit",
        description="Impose one gauge condition per symmetry family (the canonical form g·θ), "
        "report every condition, every non-uniqueness and what is not fixed, and check "
        "that the canonical form computes the same function.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        help="model name (see gauge-audit check --list); minilm and smollm2 are read as the checkpoints they are",
    )
    src.add_argument("--checkpoint", metavar="PATH", help="a Hugging Face checkpoint directory or a llama GGUF file")
    p.add_argument("--seed", type=int, default=0, help="seed of a built-in random model (and of the check inputs)")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write the canonical checkpoint (a checkpoint input: config.json + "
        "model.safetensors in its own architecture, as transform writes, with certificate.json from "
        "transformers' float64 logits; a built-in tiny model: model.safetensors in the project layout), "
        "element.npz (the canonicalising element g) and report.json; DIR must not exist",
    )
    p.add_argument(
        "--dtype",
        default="same",
        choices=("same", "float64", "float32", "bfloat16"),
        help="dtype of the written checkpoint (same: each tensor's stored dtype; GGUF: float32)",
    )
    p.add_argument(
        "--by-runs",
        action="store_true",
        help="canonicalise one run of blocks at a time, never holding the model whole in float64 "
        "(default: only where its float64 copy exceeds the available memory; RMSNorm models without "
        "biases or learned positions)",
    )
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(func=run)


def write_atomically(out: str, files: dict) -> None:
    """Write ``files`` (name → callable(path)) into a new directory ``out`` (atomically, see
    :func:`~gauge_audit.models.checkpoint.writer.atomic_dir`: an error leaves nothing at ``out``)."""
    with atomic_dir(Path(out)) as tmp:
        for fname, write in files.items():
            write(tmp / fname)


def write_canonical_checkpoint(
    out: str,
    src: Source,
    canon,
    report: dict,
    dtype: torch.dtype | None,
    ahead: CertificateAhead | None = None,
    check=None,
) -> dict:
    """The canonical form as a checkpoint of the input's own architecture (``transform``'s format
    rules and certificate), with element.npz and report.json; atomically.  ``ahead``: the helper
    processes that computed the tokenizer and the original's outputs meanwhile, and certify the
    written file while this process runs ``check`` (the function check, given the original's
    output or None; its result is the report's ``function``)."""
    from ..models.checkpoint.writer import write_hf
    from ..transform import certify_written, write_tokenizer

    ckpt = src.checkpoint
    assert ckpt is not None  # called only for a source read from a checkpoint
    with atomic_dir(Path(out)) as tmp:
        written = write_hf(tmp, ckpt, src.cfg, canon.params, dtype, progress=ticker("write", unit="tensor group"))
        if ahead is None:
            notes = write_tokenizer(ckpt, tmp)
            if check is not None:
                report["function"] = check(None)
            certificate = certify_written(ckpt, src.cfg, tmp, canon.rounding_kappa, written)
        else:
            ahead.certify(tmp, canon.rounding_kappa, written)  # the helper reads the written file now
            notes, original = ahead.collect(tmp)
            if check is not None:  # the canonical form's forward, beside the certificate's
                report["function"] = check(original)
            certificate = ahead.certificate()
        return _finish(tmp, ckpt, canon, report, written, notes, certificate)


def _finish(tmp: Path, ckpt: Checkpoint, canon, report: dict, written: dict, notes: list, certificate: dict) -> dict:
    """certificate.json, element.npz and report.json beside the written checkpoint; the certificate."""
    cert = {
        "checkpoint": str(ckpt.path),
        "kappa": canon.kappa,
        "rounding_kappa": canon.rounding_kappa,
        "written": written,
        "notes": notes,
        **certificate,
    }
    report["certificate"] = {k: v for k, v in cert.items() if k != "inputs"}
    save_element(tmp / "element.npz", canon.element())
    (tmp / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=float))
    (tmp / "certificate.json").write_text(json.dumps(cert, indent=2, sort_keys=True, default=float) + "\n")
    return cert


def _write_by_runs(out: str, src: Source, view, dtype: torch.dtype | None, report_of, check) -> tuple:
    """The canonical checkpoint written as :class:`~gauge_audit.gauge_fix.by_runs.CanonicalByRuns`
    computes it (the writer's pass gives the records), then the function check (a second pass) and
    the certificate, one after the other in this process (no helpers: each would hold its own
    model-sized tensors beside this one's).  Returns (canonical form, report, certificate)."""
    from ..models.checkpoint.writer import write_hf
    from ..transform import certify_written, write_tokenizer

    ckpt = src.checkpoint
    assert ckpt is not None  # called only for a source read from a checkpoint
    with atomic_dir(Path(out)) as tmp:
        written = write_hf(tmp, ckpt, src.cfg, view, dtype, progress=ticker("write", unit="tensor group"))
        canon = view.canonical()
        report = report_of(canon)
        report["function"] = check(canon)
        notes = write_tokenizer(ckpt, tmp)
        certificate = certify_written(ckpt, src.cfg, tmp, canon.rounding_kappa, written)
        cert = _finish(tmp, ckpt, canon, report, written, notes, certificate)
    return canon, report, cert


def _original_ahead(ckpt, cfg, params, staging: Path, n_threads: int, seed: int, tokenizer: bool):
    """The helper's half that needs only the original: its tokenizer written to ``staging`` (with
    :func:`~gauge_audit.transform.write_tokenizer`'s notes; not without ``tokenizer``) and the
    function check's output of the original
    (:func:`~gauge_audit.gauge_fix.pipeline.original_output`)."""
    from ..gauge_fix.pipeline import original_output
    from ..runtime import keep_freed_memory, threads
    from ..transform import write_tokenizer

    keep_freed_memory()  # the forward's activations reuse freed pages (see ``run``)
    with threads(n_threads):
        notes = write_tokenizer(ckpt, staging) if tokenizer else []
        return notes, original_output(cfg, params, seed)


class CertificateAhead:
    """Two forked helpers, started before canonicalisation, so that only the canonical form's own
    work is left once it is written: one converts the original's tokenizer (from a GGUF
    vocabulary) and runs the function check's forward of the original; the other computes
    transformers' float64 logits of the original, then waits for the written checkpoint and
    certifies it.  Identical to computing these afterwards in this process (the same code on the
    same threads).  Both are forked while this process holds little: the canonical form is never
    counted in their resident sets.  The price is memory for time: on SmolLM2 this process peaks
    at 1.43 GB and each helper at 0.7 GB, 2.2 GB of PSS together, where one process doing it all
    peaked at 1.85 GB and took 26 s instead of 15–16 s (one helper doing both in turn: 2.0 GB,
    21–24 s, its sequence then the longest path)."""

    def __init__(self, src: Source, n_threads: int, seed: int, certify: bool = True):
        import multiprocessing

        from ..runtime import Forked
        from ..transform import certificate_when_written

        self.staging = Path(tempfile.mkdtemp(prefix="gauge-audit-tokenizer-"))
        self.job = Forked(_original_ahead, src.checkpoint, src.cfg, src.params, self.staging, n_threads, seed, certify)
        self._send: object | None = None
        self.cert = None
        if certify:  # nothing is written without --out: the first helper alone
            self._request, send = multiprocessing.Pipe(duplex=False)
            self._send = send
            self.cert = Forked(certificate_when_written, src.checkpoint, src.cfg, self._request, send, n_threads)

    def certify(self, directory: Path, kappa: float, written: dict) -> None:
        """Send the written checkpoint to the certifying helper."""
        assert self._send is not None
        self._send.send((str(directory), kappa, written))  # type: ignore[attr-defined]

    def collect(self, directory: Path) -> tuple[list[str], tuple[torch.Tensor, dict | None]]:
        """The notes and the original's function-check output; the tokenizer's files moved into
        ``directory``."""
        notes, original = self.job.result()
        for f in sorted(self.staging.iterdir()):
            shutil.move(str(f), str(directory / f.name))
        return notes, original

    def original(self) -> tuple[torch.Tensor, dict | None]:
        """The original's function-check output (the helper's work when nothing is written)."""
        return self.job.result()[1]

    def certificate(self) -> dict:
        assert self.cert is not None  # created with certify=True
        cert = self.cert.result()
        assert cert is not None  # certify() was called
        return cert

    def close(self) -> None:
        if self._send is not None:  # a helper still waiting for a checkpoint ends (EOF)
            self._send.close()  # type: ignore[attr-defined]
            self._send = None
        shutil.rmtree(self.staging, ignore_errors=True)


def run(args) -> int:
    # keep_freed_memory() is not called here, only in the helpers (transformers' forwards, which
    # free and allocate the same activations again and again: SmolLM2's page faults 4.4 M → 2.8 M,
    # kernel time 15 → 11 s, peak unchanged): in this process the heap that is never trimmed would
    # raise the peak (1.44 → 1.55 GB) for its single pass of the steps
    if args.checkpoint and needs_derivation(Path(args.checkpoint)):
        return run_measured(args)
    # the checkpoint read from its file when asked (twice: canonicalisation, function check), not held
    src = load_source(
        args.checkpoint or args.model, args.seed, checkpoint=bool(args.checkpoint), native=True, resident=False
    )
    dtype = None if args.dtype == "same" else resolve_dtype(args.dtype)
    if args.out:
        refuse_existing(Path(args.out))
    if by_runs(src, "canonicalize", "gauge fixing", "canonicalising", args.by_runs):
        with model_threads(parameter_count(src.cfg)):
            return _run_by_runs(args, src, dtype)
    # one thread up to billion-parameter models (the runtime's thread policy): the reads and
    # float64 conversions, and the forwards of the function check and the certificate on a few
    # dozen tokens (the steps themselves run on one thread anyway)
    with model_threads(parameter_count(src.cfg)):
        # the certificate's parts that need only the original start now, beside the
        # canonicalisation, on the threads chosen here
        # (a checkpoint without --out: the original's function-check output alone, also beside the
        # canonicalisation, and not held in this process beside the canonical form)
        ahead = (
            CertificateAhead(src, torch.get_num_threads(), args.seed, certify=bool(args.out))
            if src.checkpoint is not None
            else None
        )
        try:
            return _run(args, src, dtype, ahead)
        finally:
            if ahead is not None:
                ahead.close()


def run_measured(args) -> int:
    """An architecture without a family file: the canonical form under the group measured on
    transformers' own forward (see :mod:`gauge_audit.gauge_fix.measured_canonical`)."""
    from ..gauge_fix.measured_canonical import canonicalize_checkpoint, format_report

    if args.by_runs:
        raise GaugeAuditError("--by-runs is not available for an architecture without a family file")
    dtype = None if args.dtype == "same" else resolve_dtype(args.dtype)
    _, report = canonicalize_checkpoint(
        Path(args.checkpoint),
        Path(args.out) if args.out else None,
        seed=args.seed,
        dtype=dtype,
        say=(lambda line: None) if args.json else echo,
    )
    print(json.dumps(report, sort_keys=True) if args.json else format_report(report))
    cert = report.get("certificate")
    return 0 if report["function"]["verdict"] == "HOLDS" and (cert is None or cert["verdict"] == "HOLDS") else 1


def _run_by_runs(args, src: Source, dtype: torch.dtype | None) -> int:
    """:func:`_run` one run of blocks at a time (:mod:`gauge_audit.gauge_fix.by_runs`)."""
    from ..gauge_fix.by_runs import CanonicalByRuns

    ckpt = src.checkpoint
    # a checkpoint's float64 reads, each a tensor of its own (the embeddings are rotated in them)
    params = ckpt.params() if ckpt is not None else src.params
    t0 = time.perf_counter()
    view = CanonicalByRuns(
        src.cfg, params, src.storage_dtype, progress=ticker("canonicalize", unit="run"), owned=ckpt is not None
    )

    def report_of(canon) -> dict:
        return {"model": src.label, "seed": args.seed, "seconds": time.perf_counter() - t0, **canon.report()}

    def check(canon) -> dict:
        view.follow(ticker("function check", unit="run"))  # a second pass over the runs
        return function_check(
            src.cfg, params, canon.params, canon.rounding_kappa, seed=args.seed, element=canon.element()
        )

    cert = None
    if args.out and ckpt is not None:
        canon, report, cert = _write_by_runs(args.out, src, view, dtype, report_of, check)
    else:
        canon = view.canonical()
        report = report_of(canon)
        report["function"] = check(canon)
        if args.out:
            _write_project_layout(args, src, canon, report, dtype)
    return _summary(args, src, canon, report, cert)


def _write_project_layout(args, src: Source, canon, report: dict, dtype: torch.dtype | None) -> None:
    """A built-in model's canonical form: model.safetensors in the project layout, element.npz,
    report.json."""
    from safetensors.torch import save_file

    params = {k: canon.params[k].to(dtype or torch.float64).contiguous() for k in canon.params}
    write_atomically(
        args.out,
        {
            "model.safetensors": lambda p: save_file(
                params, str(p), metadata={"layout": "gauge-audit", "model": src.label}
            ),
            "element.npz": lambda p: save_element(p, canon.element()),
            "report.json": lambda p: p.write_text(json.dumps(report, indent=1, sort_keys=True, default=float)),
        },
    )


def _run(args, src: Source, dtype: torch.dtype | None, ahead: CertificateAhead | None = None) -> int:
    t0 = time.perf_counter()
    canon = canonicalize(src.cfg, src.params, storage_dtype=src.storage_dtype)
    seconds = time.perf_counter() - t0
    report = {"model": src.label, "seed": args.seed, "seconds": seconds, **canon.report()}

    def check(original) -> dict:
        # the tolerance's κ: that of the dense steps (diagonal scalings such as the folding of
        # norm weights do not amplify rounding, gauge_fix.base.DIAGONAL)
        return function_check(
            src.cfg,
            src.params,
            canon.params,
            canon.rounding_kappa,
            seed=args.seed,
            element=canon.element(),
            original=original,
        )

    cert = None
    if args.out and src.checkpoint is not None:
        cert = write_canonical_checkpoint(args.out, src, canon, report, dtype, ahead, check)
    else:
        report["function"] = check(ahead.original() if ahead is not None else None)
    if cert is None and args.out:
        _write_project_layout(args, src, canon, report, dtype)
    return _summary(args, src, canon, report, cert)


def _summary(args, src: Source, canon, report: dict, cert: dict | None) -> int:
    """The report, as JSON or as lines."""
    fn = report["function"]
    seconds = report["seconds"]
    if args.json:
        print(json.dumps(report, sort_keys=True, default=float))
        return 0
    counts = report["conditions"]
    n_params = parameter_count(src.cfg)
    echo(f"{src.label}: {n_params:,} parameters, canonicalised in {seconds:.2f} s")
    echo(f"gauge conditions imposed: {report['conditions_total']} ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    echo(f"largest condition residual: {max(report['condition_residual_max'].values(), default=0.0):.2e}")
    echo(
        f"element g: {len(canon.records)} steps, κ = {canon.kappa:.4g} (dense steps, which amplify rounding: "
        f"{canon.rounding_kappa:.4g})"
    )
    echo(
        f"same function: {fn['verdict']} (max rel. change {fn['residual_eps']:.3g} ε; statistical tolerance "
        f"{fn['tolerance_statistical_eps']:.4g} ε, worst case {fn['tolerance_eps']:.4g} ε)"
    )
    ties = report["not_unique"]
    echo(f"non-unique choices: {sum(t['not_unique'] for t in ties) if ties else 'none'}")
    for t in ties:
        echo(
            f"  {t['step']}: {t['not_unique']} of {t['n']} {t['kind']} decisions in {t['where']} "
            f"(smallest margin {t['min_margin']:.2e} ≤ {t['threshold']:.2e})"
        )
    for n in report["notes"]:
        echo(f"  note: {n}")
    for u in report["unfixed"]:
        echo(f"not fixed: {u['family']} — {u['reason']}")
    if cert is not None:
        echo(
            f"wrote {args.out}: config.json, model.safetensors ({cert['dtype']}, {cert['written']['tensors']} tensors), "
            f"element.npz, report.json, certificate.json"
        )
        echo(
            f"certificate: transformers' float64 logits of the written checkpoint change by {cert['residual_eps']:.3g} "
            f"ε({cert['dtype']}); statistical tolerance {cert['tolerance_statistical_eps']:.4g} ε, worst case "
            f"{cert['tolerance_eps']:.4g} ε: {cert['verdict']}"
        )
    elif args.out:
        echo(f"wrote {args.out}/model.safetensors (project layout), element.npz, report.json")
    return 0
