"""``gauge-audit transform``: write a gauge-transformed checkpoint plus a certificate that
transformers computes the same function from it (see :mod:`gauge_audit.transform`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import GaugeAuditError
from ..models.derived import needs_derivation
from ..progress import echo
from ..runtime import resolve_dtype


def register(sub) -> None:
    p = sub.add_parser(
        "transform",
        help="write a gauge-transformed copy of a checkpoint, with a certificate",
        description="Apply a gauge action to a Hugging Face or GGUF checkpoint, write the result as a "
        "Hugging Face directory (config.json, model.safetensors, tokenizer, "
        "certificate.json) and certify with transformers' own float64 logits that the "
        "function is unchanged.",
    )
    p.add_argument("--checkpoint", required=True, metavar="DIR_OR_GGUF")
    p.add_argument("--action", required=True, help="action name (see gauge-audit check --list)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--seed", type=int, default=0, help="draw the group element from this seed (as check --seed)")
    g.add_argument("--element", metavar="NPZ", help="use this group element instead (an .npz with the action's parts)")
    p.add_argument("--kappa", type=float, default=10.0, help="condition number of a sampled GL element")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist)")
    p.add_argument("--untie", action="store_true", help="untie the unembedding first (W_U = W_Eᵀ as its own tensor)")
    p.add_argument(
        "--dtype",
        default="same",
        choices=("same", "float64", "float32", "bfloat16"),
        help="dtype of the written weights (same: each tensor's stored dtype; GGUF: float32)",
    )
    p.add_argument("--json", action="store_true", help="print the certificate as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..transform import transform

    if not args.kappa >= 1:
        raise GaugeAuditError("--kappa must be a number >= 1")
    dtype = None if args.dtype == "same" else resolve_dtype(args.dtype)
    if needs_derivation(Path(args.checkpoint)):
        return run_measured(args, dtype)
    cert = transform(
        args.checkpoint,
        args.action,
        args.out,
        seed=args.seed,
        element=args.element,
        kappa=args.kappa,
        untie=args.untie,
        dtype=dtype,
        say=None if args.json else echo,
    )
    if args.json:
        print(json.dumps(cert.to_json(), sort_keys=True))
    else:
        if cert.untied:
            print(f"untied the unembedding: +{cert.untied['added_parameters']:,} parameters")
        print(
            f"wrote {args.out}: {cert.written['tensors']} tensors ({cert.dtype}, "
            f"{cert.written['bytes'] / 2**20:.1f} MiB), certificate.json"
        )
        print(
            f"{cert.action} (κ = {cert.kappa:.3g}): transformers' float64 logits change by "
            f"{cert.max_rel_change:.3e} relative = {cert.residual_eps:.3g} ε({cert.dtype}); "
            f"tolerance {cert.tolerance_eps:.3g} ε ({cert.tolerance_formula})"
        )
        print(f"verdict: {cert.verdict}; greedy next token {'unchanged' if cert.next_token_unchanged else 'CHANGED'}")
    return 0 if cert.verdict == "HOLDS" else 1


def run_measured(args, dtype) -> int:
    """An architecture without a family file: an element of the group measured on transformers'
    own forward (``--action composite`` or one measured family), see :mod:`gauge_audit.measured`."""
    from ..measured import transform

    if args.element or args.untie:
        raise GaugeAuditError("--element and --untie are not available for an architecture without a family file")
    cert = transform(
        Path(args.checkpoint),
        args.action,
        Path(args.out),
        seed=args.seed,
        kappa=args.kappa,
        dtype=dtype,
        say=(lambda line: None) if args.json else echo,
    )
    if args.json:
        print(json.dumps(cert, sort_keys=True))
    else:
        print(
            f"wrote {args.out}: {cert['action']} of the measured group ({', '.join(cert['families']) or 'discrete maps'})"
        )
        print(
            f"{cert['action']} (κ = {cert['kappa']:.3g}): transformers' float64 logits change by "
            f"{cert['max_rel_change']:.3e} relative = {cert['residual_eps']:.3g} ε({cert['dtype']}); "
            f"tolerance {cert['tolerance_eps']:.3g} ε ({cert['tolerance_formula']})"
        )
        print(
            f"verdict: {cert['verdict']}; greedy next token {'unchanged' if cert['next_token_unchanged'] else 'CHANGED'}"
        )
    return 0 if cert["verdict"].startswith("HOLDS") else 1
