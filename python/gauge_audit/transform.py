"""``gauge-audit transform``: write a gauge-transformed copy of a checkpoint, with a certificate
that transformers computes the same function from it.

    cert = transform("SmolLM2.gguf", "qk-gl", "out/", seed=0)

1. Open the checkpoint (HF directory or GGUF); optionally untie the unembedding first (QuaRot's
   first step: W_U = W_Eᵀ becomes its own tensor, vocab·d_model more parameters).
2. Refuse an action that has no function-preserving rule for this checkpoint, with the reason
   (``action.applies``), and the deliberate false rules.
3. Draw the element from ``--seed`` (the same element ``check --seed`` applies) or read it from
   ``--element``; apply it block by block and stream the result into ``model.safetensors``
   (the stored dtype of each tensor unless ``dtype`` is given; GGUF input → float32).
4. Certificate: transformers' own model classes evaluate the original and the *written* files in
   float64 (see :mod:`.reference`) on a fixed input set recorded in the certificate; the maximum
   relative change of the logits is compared with the derived tolerance κ·L·K·ε, ε the machine
   epsilon of the written dtype (the transformed weights are rounded to it).
5. Everything is written to a temporary directory next to ``out`` and renamed at the end.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .actions import get_action
from .actions.blockwise import transformed
from .actions.elements import load_element
from .errors import GaugeAuditError
from .models import Model, family_of
from .models.checkpoint import open_checkpoint
from .models.checkpoint.safetensors_file import SafetensorsFile
from .models.checkpoint.writer import atomic_dir, refuse_existing, write_hf
from .models.params import untie as untie_params
from .numeric import tolerance
from .progress import ticker
from .runtime import eps, generator

CERT_SEED, CERT_BATCH, CERT_LEN = 0, 2, 16


@dataclass
class Certificate:
    checkpoint: str
    format: str
    architecture: str
    action: str
    element: dict  # {"seed": S} or {"file": path, "sha256": ...}
    kappa: float
    untied: dict | None  # {"added_parameters": n} when --untie
    dtype: str  # the written dtype (coarsest over tensors)
    inputs: dict  # the recorded input set (token ids)
    reference: str  # what computed the logits
    max_rel_change: float  # ‖y′ − y‖∞ / ‖y‖∞ of transformers' float64 logits
    residual_eps: float
    tolerance: float
    tolerance_eps: float
    tolerance_formula: str
    verdict: str  # HOLDS / FAILS
    next_token_unchanged: bool
    written: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def certificate_inputs(cfg) -> dict:
    g = generator(CERT_SEED)
    n = min(CERT_LEN, cfg.n_ctx)
    inputs = {"tokens": torch.randint(0, cfg.vocab, (CERT_BATCH, n), generator=g)}
    if cfg.n_types:
        inputs["token_types"] = torch.randint(0, cfg.n_types, (CERT_BATCH, n), generator=g)
    return inputs


def transform(
    checkpoint: str | Path,
    action: str,
    out: str | Path,
    *,
    seed: int = 0,
    element: str | None = None,
    kappa: float = 10.0,
    untie: bool = False,
    dtype: torch.dtype | None = None,
    say: Callable[[str], None] | None = None,
) -> Certificate:
    """Write the transformed checkpoint to ``out`` and return its certificate (module docstring);
    ``say`` receives progress lines."""
    from .reference import require_transformers

    require_transformers()
    out = Path(out)
    refuse_existing(out)  # before the checkpoint is read
    ckpt = open_checkpoint(checkpoint)
    act = get_action(action)
    cfg, params, added = ckpt.cfg, ckpt.params(), None
    if untie:
        if not cfg.tied:
            raise GaugeAuditError(f"--untie: {ckpt.name} has an untied unembedding already")
        cfg, params = untie_params(cfg, params)
        added = {"added_parameters": cfg.vocab * cfg.d_model}
    reason = act.applies(cfg)
    if reason:
        hint = " (--untie unties the unembedding first, as QuaRot does)" if cfg.tied and "tied" in reason else ""
        raise GaugeAuditError(f"{action} has no function-preserving rule for {ckpt.name}: {reason}{hint}")
    if not act.expected_holds(cfg):
        raise GaugeAuditError(
            f"{action} is a false rule on {ckpt.name} (it changes the function; "
            f"gauge-audit check shows by how much): {(act.doc.splitlines() or [''])[0]}"
        )
    if element:
        el = load_element(element)
        el_info: dict[str, object] = {
            "file": str(element),
            "sha256": hashlib.sha256(Path(element).read_bytes()).hexdigest(),
        }
    else:
        el = act.sample(cfg, params, generator(seed + 1), kappa)
        el_info = {"seed": seed}
    new = transformed(act, cfg, params, el)

    with atomic_dir(out) as tmp:
        say = say or (lambda line: None)
        say(f"transform: {ckpt.describe()}")
        written = write_hf(tmp, ckpt, cfg, new, dtype, progress=ticker("write", unit="tensor group"))
        notes = write_tokenizer(ckpt, tmp)
        say("transform: certificate (transformers' logits, float64) ...")
        c = certify_written(ckpt, cfg, tmp, el.kappa, written)
        cert = Certificate(
            checkpoint=str(ckpt.path),
            format=ckpt.format,
            architecture=ckpt.arch.name,
            action=action,
            element=el_info,
            kappa=el.kappa,
            untied=added,
            dtype=written["dtype"],
            inputs=c["inputs"],
            reference=c["reference"],
            max_rel_change=c["max_rel_change"],
            residual_eps=c["residual_eps"],
            tolerance=c["tolerance"],
            tolerance_eps=c["tolerance_eps"],
            tolerance_formula=c["tolerance_formula"],
            verdict="HOLDS" if c["max_rel_change"] <= c["tolerance"] else "FAILS",
            next_token_unchanged=c["next_token_unchanged"],
            written=written,
            notes=notes,
        )
        (tmp / "certificate.json").write_text(json.dumps(cert.to_json(), indent=2) + "\n")
    return cert


def write_tokenizer(ckpt, directory: Path) -> list[str]:
    """A GGUF input's tokenizer, converted by transformers, next to the written weights (write_hf
    copies an HF directory's tokenizer files itself); returns the checkpoint's notes plus what
    was done."""
    from .reference import tokenizer

    notes = list(ckpt.notes)
    if ckpt.format == "gguf" and ckpt.source.field("tokenizer.ggml.model") is not None:
        tokenizer(ckpt).save_pretrained(str(directory))
        notes.append("tokenizer converted from the GGUF vocabulary by transformers")
    elif ckpt.format == "gguf":
        notes.append("the GGUF file holds no tokenizer; none written")
    return notes


def original_logits(ckpt, cfg) -> torch.Tensor:
    """transformers' float64 logits of the original checkpoint on the certificate's inputs (the
    half of :func:`certify_written` that needs nothing written)."""
    from .reference import Reference, checkpoint_tensors

    return Reference(ckpt.arch, ckpt.hf_config, ckpt.cfg).forward(checkpoint_tensors(ckpt), certificate_inputs(cfg))


def certificate_when_written(ckpt, cfg, request, sender, n_threads: int) -> dict | None:
    """A written checkpoint's certificate (:func:`certify_written`), for a helper process started
    before the checkpoint exists: it computes :func:`original_logits` first (on ``n_threads``
    torch threads), then waits for ``request`` (a connection) to send the written directory, κ and
    ``write_hf``'s record.  None if the request never comes (the caller closed ``sender``, its
    end, which a forked helper closes at once: otherwise its own copy would keep it open)."""
    from .runtime import keep_freed_memory, threads

    sender.close()
    keep_freed_memory()  # a helper process: its forwards' activations reuse freed pages, nothing else runs here
    with threads(n_threads):
        before = original_logits(ckpt, cfg)
        try:
            directory, kappa, written = request.recv()
        except EOFError:
            return None
        return certify_written(ckpt, cfg, Path(directory), kappa, written, before)


def certify_written(
    ckpt, cfg, directory: Path, kappa: float, written: dict, before: torch.Tensor | None = None
) -> dict:
    """transformers' own model class evaluates the original checkpoint and the one written to
    ``directory`` (config.json + model.safetensors) in float64 on the recorded input set; the
    maximum relative change of the logits against κ·L·K·ε (worst case) and κ·λ·√(L·K)·ε
    (statistical), ε that of the written dtype.  ``before``: the original's logits, if computed
    already (:func:`original_logits`)."""
    from .numeric import statistical_tolerance, verdict_for
    from .reference import Reference, require_transformers

    T = require_transformers()
    inputs = certificate_inputs(cfg)
    n = inputs["tokens"].shape[1]
    if before is None:
        before = original_logits(ckpt, cfg)
    out_hf = json.loads((Path(directory) / "config.json").read_text())
    stored = SafetensorsFile(Path(directory) / "model.safetensors")
    after = Reference(ckpt.arch, out_hf, cfg).forward(lambda name: stored.get(name, torch.float64), inputs)
    err = float((after - before).abs().max() / before.abs().max())
    wdtype = getattr(torch, written["dtype"])
    model = Model(ckpt.name, cfg, {}, family_of(cfg))
    tol, formula = tolerance(model, kappa, wdtype, n)
    tol_stat, _ = statistical_tolerance(model, kappa, wdtype, n, before.numel())
    e = eps(wdtype)
    same = bool(torch.equal(before[:, -1].argmax(-1), after[:, -1].argmax(-1))) if cfg.unembed else True
    return {
        "inputs": {k: v.tolist() for k, v in inputs.items()},
        "reference": f"transformers {T.__version__} {ckpt.arch.name}, float64 (RMSNorm / RoPE / router in float64)",
        "dtype": written["dtype"],
        "max_rel_change": err,
        "residual_eps": err / e,
        "tolerance": tol,
        "tolerance_eps": tol / e,
        "tolerance_formula": formula,
        "tolerance_statistical": tol_stat,
        "tolerance_statistical_eps": tol_stat / e,
        "verdict": verdict_for(err, tol_stat, tol),
        "next_token_unchanged": same,
    }
