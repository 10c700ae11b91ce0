"""``gauge-audit nullity``: measure the symmetry dimension (Jacobian nullity) and explain it."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any, cast

from ..errors import GaugeAuditError
from ..models.architectures import ARCHITECTURES
from ..models.config import ACTS, NORMS, QK_NORMS
from . import _HelpFormatter

LM = ("gpt2", "llama", "qwen", "moe")


def _has(cfg, field: str) -> bool:
    """Whether the family's config has ``field`` (an option only some families take)."""
    return any(f.name == field for f in fields(cfg))


def _defaults_epilog() -> str:
    """Every family's defaults, read from its config (so --help says what each option defaults to)."""
    rows = []
    for name, arch in sorted(ARCHITECTURES.items()):
        c = arch.config()
        extra = ""
        if _has(c, "attn_softcap"):
            g = cast(Any, c)
            extra = (
                f" softcap {g.attn_softcap:g} final-softcap {g.final_softcap:g} window {g.window}"
                f" query-pre-attn-scalar {g.query_pre_attn_scalar or g.d_head:g}"
            )
        elif c.window:
            extra = f" window {c.window}"
        rows.append(
            f"  {name:8s} d-model {c.d_model} n-heads {c.n_heads} n-kv-heads {c.n_kv_heads} d-head {c.d_head} "
            f"d-ff {c.d_ff} vocab {c.vocab} n-ctx {c.n_ctx} layers {c.n_layers} norm {c.norm} "
            f"norm-eps {c.norm_eps:g} act {c.act} {'tied' if c.tied else 'untied'} pos {c.pos}"
            f"{f' rotary-dim {c.rotary_dim}' if c.rotary_dim else ''} qk-norm {c.qk_norm} "
            f"norm-placement {c.norm_placement}{' parallel-residual' if c.parallel_residual else ''}{extra}"
        )
    return "family defaults (each option below overrides its family's):\n" + "\n".join(rows)


def register(sub) -> None:
    p = sub.add_parser(
        "nullity",
        help="measure the dimension of the symmetry group (Jacobian nullity) and explain it",
        description="Nullity of ∂outputs/∂parameters at a generic float64 point (rows ≥ 3·P), "
        "compared with the theory's symmetry families and the papers' counts.",
        epilog=_defaults_epilog(),
        formatter_class=_TableEpilog,
    )
    p.add_argument(
        "--family",
        required=True,
        choices=sorted(ARCHITECTURES),
        help="the architecture, at small sizes (its defaults: below)",
    )
    sizes = {
        "d-model": "stream width",
        "n-heads": "query heads",
        "n-kv-heads": "key/value heads (default: --n-heads when that is given, else the family's)",
        "d-head": "head size",
        "d-ff": "FFN width",
        "n-ctx": "sequence length",
        "vocab": "vocabulary size",
        "layers": "blocks",
    }
    for name, what in sizes.items():
        p.add_argument(f"--{name}", type=int, help=what if "default" in what else f"{what} (default: the family's)")
    p.add_argument("--act", choices=ACTS, help="FFN activation (default: the family's)")
    p.add_argument("--norm", choices=NORMS, help="the norms (default: the family's)")
    p.add_argument("--norm-eps", type=float, help="the norms' ε (default: the family's; 0 makes scale exact)")
    bias = p.add_mutually_exclusive_group()
    bias.add_argument("--bias", dest="bias", action="store_const", const=True, help="biases on Q, K, V, O and the MLP")
    bias.add_argument("--no-bias", dest="bias", action="store_const", const=False, help="no biases at all")
    tie = p.add_mutually_exclusive_group()
    tie.add_argument(
        "--tied", dest="tied", action="store_const", const=True, help="tie the unembedding to the token embedding"
    )
    tie.add_argument(
        "--untied",
        dest="tied",
        action="store_const",
        const=False,
        help="an unembedding of its own (default: the family's)",
    )
    p.add_argument("--rope", action="store_true", help="rotary position embedding on q and k (default: the family's)")
    p.add_argument("--experts", type=int, help="mixture of experts (0: a dense FFN; default: the family's)")
    p.add_argument("--top-k", type=int, help="experts per token (default: the family's, or min(2, experts))")
    p.add_argument(
        "--qk-norm",
        choices=QK_NORMS,
        help="RMSNorm on q and k before RoPE: per head with weights shared "
        "by the heads (Qwen3, Gemma 3), or over all heads jointly (OLMo 2) (default: the family's)",
    )
    p.add_argument(
        "--rotary-dim",
        type=int,
        metavar="R",
        help="RoPE rotates the first R coordinates of each head (default: the family's; 0: all of them)",
    )
    p.add_argument(
        "--norm-placement",
        choices=("pre", "post", "output", "sandwich"),
        help="pre: x + f(n(x)); post: n(x + f(x)); output: x + n(f(x)) (OLMo 2); "
        "sandwich: x + n'(f(n(x))) (Gemma) (default: the family's)",
    )
    par = p.add_mutually_exclusive_group()
    par.add_argument(
        "--parallel-residual",
        dest="parallel_residual",
        action="store_const",
        const=True,
        help="x + Attn(n1(x)) + FFN(n2(x)) (GPT-NeoX)",
    )
    par.add_argument(
        "--no-parallel-residual",
        dest="parallel_residual",
        action="store_const",
        const=False,
        help="the sublayers in sequence (default: the family's)",
    )
    p.add_argument(
        "--softcap", type=float, metavar="C", help="Gemma: scores c·tanh(s/c) (0: none; default: the family's)"
    )
    p.add_argument(
        "--final-softcap", type=float, metavar="C", help="Gemma: logits c·tanh(z/c) (0: none; default: the family's)"
    )
    p.add_argument(
        "--window",
        type=int,
        metavar="W",
        help="sliding-window attention: a position sees the last W (Gemma: on its sliding layers; "
        "0: none; default: the family's)",
    )
    p.add_argument(
        "--query-pre-attn-scalar",
        type=float,
        metavar="S",
        help="Gemma: scores scaled by S^-1/2 (0: d_head; default: the family's)",
    )
    _add_mla_args(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the random parameter point and sketches")
    p.add_argument(
        "--rows-factor",
        type=float,
        default=3.0,
        metavar="F",
        help="Jacobian rows ≥ F·P; models whose first block reads the raw embedding (OLMo 2, a "
        "parallel first block) at vocab ≫ d need more occurrences of every token (F ≈ 5)",
    )
    p.add_argument(
        "--method",
        choices=("dense", "matrix-free"),
        default="dense",
        help="dense SVD of the Jacobian, or the matrix-free sketch with a Cholesky certificate",
    )
    from ..nullity.cost import DEFAULT_MAX_MINUTES
    from ..nullity.matrixfree import ROUNDING

    p.add_argument(
        "--rounding",
        choices=ROUNDING,
        default=ROUNDING[0],
        help="matrix-free: the rounding-error model behind the Cholesky certificate "
        "(worst-case is rigorous; the others are Higham–Mary probabilistic bounds)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=DEFAULT_MAX_MINUTES,
        metavar="M",
        help=f"refuse up front, with the estimate, a measurement the cost model puts above M minutes "
        f"(default: {DEFAULT_MAX_MINUTES:g}; 0: no limit) — or above the free memory (always)",
    )
    p.add_argument("--plot", metavar="PATH", help="save the singular-value spectrum (dense) with the gap marked")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


class _TableEpilog(_HelpFormatter):
    """The project's help formatter (defaults shown), with the epilog's table kept as written."""

    def _fill_text(self, text, width, indent):
        return "".join(indent + line for line in text.splitlines(keepends=True))


def build_cfg(args):
    if args.family not in ARCHITECTURES:
        raise GaugeAuditError(f"unknown family {args.family!r}; known: {', '.join(sorted(ARCHITECTURES))}")
    arch = ARCHITECTURES[args.family]
    base = arch.config()  # the family's defaults say which parts it has
    o = {}
    for arg, field in (
        ("d_model", "d_model"),
        ("n_heads", "n_heads"),
        ("n_kv_heads", "n_kv_heads"),
        ("d_head", "d_head"),
        ("d_ff", "d_ff"),
        ("n_ctx", "n_ctx"),
        ("vocab", "vocab"),
        ("layers", "n_layers"),
        ("experts", "experts"),
        ("top_k", "top_k"),
    ):
        v = getattr(args, arg)
        if v is not None:
            if v < (0 if arg == "experts" else 1):
                raise GaugeAuditError(f"--{arg.replace('_', '-')} must be a positive integer, got {v}")
            o[field] = v
    if args.n_heads is not None and args.n_kv_heads is None:
        o["n_kv_heads"] = args.n_heads  # MHA unless --n-kv-heads says otherwise
    if args.act:
        o["act"] = args.act
    if args.norm:
        if base.attention_only:
            raise GaugeAuditError("the attn family has no norms (--norm does not apply)")
        o["norm"] = args.norm
    if args.norm_eps is not None:
        if not (args.norm_eps >= 0 and math.isfinite(args.norm_eps)):
            raise GaugeAuditError("--norm-eps must be a finite number >= 0")
        o["norm_eps"] = args.norm_eps
    if args.bias is not None:
        o.update(attn_bias=args.bias, out_bias=args.bias, mlp_bias=args.bias and not base.attention_only)
    if args.tied is not None:
        o["tied"] = args.tied
    if args.rope:
        o["pos"] = "rope"
    if args.qk_norm:
        o["qk_norm"] = args.qk_norm
    if args.rotary_dim is not None:
        whole = base.whole_head_rotary
        if whole and args.rotary_dim not in (0, base.d_head if args.d_head is None else args.d_head):
            raise GaugeAuditError(f"the {args.family} family rotates the whole head (--rotary-dim does not apply)")
        o["rotary_dim"] = args.rotary_dim if not whole else 0
    if args.norm_placement:
        o["norm_placement"] = args.norm_placement
    if args.parallel_residual is not None:
        o["parallel_residual"] = args.parallel_residual
    if args.window is not None:
        if args.window < 0:
            raise GaugeAuditError(f"--window must be an integer >= 0, got {args.window}")
        o["window"] = args.window
    for arg, field in (
        ("softcap", "attn_softcap"),
        ("final_softcap", "final_softcap"),
        ("query_pre_attn_scalar", "query_pre_attn_scalar"),
    ):
        v = getattr(args, arg)
        if v is None:
            continue
        if not _has(base, field):
            owners = " or ".join(n for n, a in sorted(ARCHITECTURES.items()) if _has(a.config(), field))
            raise GaugeAuditError(f"--{arg.replace('_', '-')} is an option of --family {owners} only")
        if not (v >= 0 and math.isfinite(v)):
            raise GaugeAuditError(f"--{arg.replace('_', '-')} must be a finite number >= 0, got {v}")
        o[field] = v
    if base.attention_only and (args.act or args.d_ff or args.vocab):
        raise GaugeAuditError("the attn family takes continuous inputs and has no FFN (--act/--d-ff/--vocab)")
    if (args.experts or args.top_k) and base.attention_only:
        raise GaugeAuditError("--experts needs a family with an FFN")
    if args.experts and args.top_k is None:
        o["top_k"] = min(2, args.experts)
    if args.experts == 0:
        o["top_k"] = 0
    if args.n_heads is not None and args.n_kv_heads is not None and args.n_heads % args.n_kv_heads:
        raise GaugeAuditError(f"--n-heads ({args.n_heads}) must be divisible by --n-kv-heads ({args.n_kv_heads})")
    o.update(_mla_options(args, o, base.latent_attention))
    return arch.config(**o)


# ----------------------------------------------------------------------------- MLA (deepseek)
_MLA_FLAGS = (
    ("q-lora-rank", "q_lora_rank", 0, "rank of the query latent (0: a plain per-head W_Q)"),
    ("kv-lora-rank", "kv_lora_rank", 1, "rank of the key/value latent"),
    ("qk-nope-dim", "nope_dim", 0, "unrotated query/key coordinates per head"),
    ("rope-head-dim", "d_head", 2, "RoPE coordinates per head (one RoPE key shared by the heads)"),
    ("v-head-dim", "v_dim", 1, "value coordinates per head"),
)


def _add_mla_args(p) -> None:
    for flag, _, _, text in _MLA_FLAGS:
        p.add_argument(f"--{flag}", type=int, metavar="R" if "rank" in flag else "D", help=f"deepseek: {text}")


def _mla_options(args, o: dict, latent: bool) -> dict:
    """The deepseek family's MLA widths; its d_head is the RoPE width (as in transformers' config)."""
    given = {flag: getattr(args, flag.replace("-", "_")) for flag, *_ in _MLA_FLAGS}
    if not latent:
        bad = [f"--{f}" for f, v in given.items() if v is not None]
        if bad:
            raise GaugeAuditError(f"{', '.join(bad)}: multi-head latent attention is the deepseek family's")
        return {}
    if args.d_head is not None:
        raise GaugeAuditError("deepseek: give the head widths with --qk-nope-dim, --rope-head-dim, --v-head-dim")
    out: dict[str, int | float] = {}
    for flag, field, low, _ in _MLA_FLAGS:
        v = given[flag]
        if v is not None:
            if v < low:
                raise GaugeAuditError(f"--{flag} must be an integer >= {low}, got {v}")
            out[field] = v
    if args.experts:  # a chosen expert count: plain top-k routing (no expert groups)
        out.update(n_group=1, topk_group=1)
    if o.get("experts") == 0:
        out.update(n_group=1, topk_group=1, first_dense=0)
    if args.norm_eps is not None:
        out["latent_eps"] = args.norm_eps  # the latents' norms too (ε = 0 makes their scales exact)
    return out


def run(args) -> int:
    from ..nullity.analysis import analyze, describe, verdict

    cfg = build_cfg(args)
    if args.plot and args.method != "dense":
        raise GaugeAuditError("--plot needs the dense spectrum (--method dense)")
    if not (args.max_minutes >= 0 and math.isfinite(args.max_minutes)):
        raise GaugeAuditError("--max-minutes must be a finite number >= 0 (0: no limit)")
    if not (args.rows_factor >= 1 and math.isfinite(args.rows_factor)):
        raise GaugeAuditError("--rows-factor must be a finite number >= 1")
    report = analyze(
        cfg,
        seed=args.seed,
        factor=args.rows_factor,
        method=args.method,
        quiet=args.quiet or args.json,
        mf_options={"rounding": args.rounding} if args.method == "matrix-free" else None,
        max_minutes=args.max_minutes or None,
    )
    if args.plot:
        if report.singular_values is None:
            raise GaugeAuditError("--plot needs the dense spectrum (--method dense)")
        from ..nullity.plot import plot_spectrum

        plot_spectrum(report, args.plot)
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True, default=str))
        return 0 if report.unexplained == 0 and report.generators_ok else 1
    print(format_report(report, describe(cfg), verdict(report)))
    return 0 if report.unexplained == 0 and report.generators_ok else 1


def _convergence(r) -> str:
    """How the rows were settled: the nullity after each step of added rows."""
    hist = r.extra.get("rows_history")
    if not hist:
        return ""
    steps = ", ".join(f"{rows}: {n}" for rows, n in hist)
    return f"; nullity by rows {steps} ({'converged' if r.extra.get('converged') else 'NOT converged: budget of 24·P rows'})"


def format_report(r, label: str, v) -> str:
    lines = [
        f"{r.cfg.family}: {label}  (seed {r.seed}, {r.method})",
        f"  parameters P                {r.params}",
        f"  Jacobian rows               {r.rows}  ({r.rows / r.params:.1f}·P)" + _convergence(r),
        f"  measured nullity            {r.measured_nullity}   (gap ratio {r.gap_ratio:.3g}"
        + (f", next-largest gap {r.second_gap:.3g})" if r.second_gap == r.second_gap else ")"),
        f"  explained                   {r.explained}",
        f"  unexplained                 {r.unexplained}",
        "",
        "  explained by family:",
        f"    {'family':26s} {'dim':>6s}  {'formula':34s} {'max ‖Jv‖/‖J‖_F‖v‖':>18s}",
    ]
    jf = r.extra["j_fro"]
    for f in r.families:
        mark = "" if f.flat else "  (not flat at this ε)"
        kind = {"exact": "", "eps-broken": " [ε-broken]", "data": " [data]"}[f.kind]
        res = f"{f.residual / jf:.2e}" if f.residual is not None else "-"
        lines.append(f"    {f.name + kind:26s} {f.rank if f.flat else 0:6d}  {f.formula[:34]:34s} {res:>18s}{mark}")
    lines.append(
        f"  tolerance on ‖J·v‖/‖v‖: {r.tolerance_formula}  -> {'all within' if r.generators_ok else 'EXCEEDED'}"
    )
    if r.overlap:
        lines.append(
            f"  families overlap in {r.overlap} dimensions (Σ formulas {r.extra['predicted']} vs rank {r.explained})"
        )
    if r.unexplained:
        lines.append("  UNEXPLAINED flat directions — dominant parameter blocks (share):")
        for n, sh in r.unexplained_blocks:
            lines.append(f"    {n:34s} {sh:.2f}")
    if not r.genericity.clean:
        lines.append("  non-generic sample (data-dependent flat directions):")
        lines += [f"    {x}" for x in r.genericity.lines()]
    lines += ["", "  papers' counts for this configuration:"]
    names = {
        "mgs": "MGS G_Model Σ h(d_k²+d_v²)",
        "mgs-variant": "MGS RoPE/GQA variant",
        "van-nierop": "van Nierop eq. 17",
        "wiki-gqa": "wiki GQA n_q·d_k²+n_kv·d_v²",
        "wiki-log-hfact": "wiki h(d_k²+d_v²)+log h!",
    }
    for k, val in r.paper_counts.items():
        shown = f"{val:.2f}" if isinstance(val, float) else str(val)
        lines.append(f"    {names.get(k, k):32s} {shown:>10s}   (measured − claimed: {r.measured_nullity - val:+.6g})")
    lines += [
        "",
        f"  functional dimension P − nullity = {r.functional_dimension};  wiki bound P/log P = "
        f"{r.fdof_bound:.1f}  -> fdof-bound {'HOLDS' if r.fdof_bound_holds else 'FAILS'}",
        f"  maximality (G_max is everything): {v.verdict} — {v.reason}",
    ]
    t = ", ".join(f"{k} {s:.1f}s" for k, s in r.timings.items())
    lines.append(f"  time: {t}")
    return "\n".join(lines)
