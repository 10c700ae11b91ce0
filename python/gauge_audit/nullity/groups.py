"""The gauge group of an architecture, factor by factor, from its configuration alone.

Each factor names the action whose generators the nullity theory builds (``source``: the family of
:mod:`.families`), the group it integrates to, its dimension at the configuration's sizes, and
what the maximal-gauge paper's G_max (per head GL(d_k) × GL(d_v), with the RoPE commutant and GQA
tying) predicts for the same slot.  :func:`verify` measures the Jacobian nullity of a small model
with the same switches and compares, family by family: the factors' formulas against the
families' ranks, and the total against the measured nullity; :func:`verify_described` measures the
same small model a second way, through its per-tensor description (the candidate families of a
derived architecture, tested on the family's own forward).

The norm reparametrisations (a norm's γ folded into its readers, LayerNorm's ones directions, the
embedding offset) and the small-vocabulary families are part of the measured total but not of the
group table: they are ``other`` families, listed by :func:`verify` with their ranks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.deepseek import as_latent
from ..models.described import description, generic_model
from .found import SEQ, Found, measure
from .groups_mla import mla_discrete, mla_factors, mla_small

G_MAX = "G_max (per head GL(d_k)×GL(d_v), RoPE commutant, GQA tying)"


@dataclass
class Factor:
    scope: str  # "every layer", "dense layers", "MoE layers" (DeepSeek's two kinds) or "stream"
    name: str
    group: str
    dim: int  # per layer for the layer scopes
    source: str  # the nullity family that generates it ("" when blocked)
    gmax: str  # what G_max predicts for this slot
    differs: str  # "" when G_max agrees, else why not


def _rotary(cfg: Config) -> int:
    return (cfg.rotary_dim or cfg.d_head) if cfg.pos == "rope" else 0


def repeats(cfg: Config, scope: str) -> int:
    """How many times a factor of this scope occurs in the model."""
    if scope == "stream":
        return 1
    if scope == "every layer":
        return cfg.n_layers
    cfg = as_latent(cfg)
    moe = sum(cfg.moe_layer(i) for i in range(cfg.n_layers))
    return moe if scope == "MoE layers" else cfg.n_layers - moe


def factors(cfg: Config) -> list[Factor]:
    if cfg.latent_attention:
        return [*(Factor(*f) for f in mla_factors(as_latent(cfg))), _stream(cfg)]
    e, kv = cfg.d_head, cfg.n_kv_heads
    R = _rotary(cfg)
    rest = e - R if R else e
    gm_qk = kv * (e if R else e * e)
    gm_text = f"(C^×)^{{{e // 2}}} per KV group ({gm_qk})" if R else f"GL({e})^{kv} ({gm_qk})"
    out: list[Factor] = []
    if cfg.qk_norm == "none":
        grp = (f"((C^×)^{{{R // 2}}}" + (f" × GL({rest})" if rest else "") + f")^{kv}") if R else f"GL({e})^{kv}"
        dim = kv * ((R + rest * rest) if R else e * e)
        why = f"partial rotary: GL({rest}) on the {rest} unrotated coordinates" if R and rest else ""
        out.append(Factor("every layer", "QK", grp + " QK", dim, "qk-gl", gm_text, why))
    else:
        units = (R // 2 + rest) if R else e
        per = 1 if cfg.qk_norm == "head" else kv
        out.append(
            Factor(
                "every layer",
                "QK",
                f"(R^×)^{{{per * units}}} QK-norm weight scaling",
                per * units,
                "qk-norm-scale",
                gm_text,
                f"the {cfg.qk_norm} QK-norm removes GL(d_k): only γ_q ↔ γ_k rescalings per RoPE plane survive",
            )
        )
    out.append(Factor("every layer", "VO", f"GL({e})^{kv} VO", kv * e * e, "vo-gl", f"GL({e})^{kv} ({kv * e * e})", ""))
    if cfg.attn_bias and (not R or rest):
        n = kv * (rest if R else e)
        out.append(Factor("every layer", "key bias", f"R^{n} key-bias shift", n, "key-bias-shift", "-", "beyond G_max"))
    if cfg.attn_bias and cfg.out_bias:
        out.append(
            Factor("every layer", "value bias", f"R^{kv * e} b_V → b_O", kv * e, "value-bias-fold", "-", "beyond G_max")
        )
    if not cfg.attention_only:
        ex = max(cfg.experts, 1)
        if cfg.act in ("relu", "swiglu"):
            n = ex * cfg.d_ff
            kind = "R_{>0}" if cfg.act == "relu" else "R^×"
            src = "relu-scaling" if cfg.act == "relu" else "swiglu-scaling"
            out.append(Factor("every layer", "FFN", f"({kind})^{{{n}}} FFN scaling", n, src, "-", "beyond G_max"))
        else:
            out.append(Factor("every layer", "FFN", f"none ({cfg.act}: permutations only)", 0, "", "-", ""))
        if cfg.experts:
            out.append(
                Factor("every layer", "router", f"R^{cfg.d_model} router offset", cfg.d_model, "router-offset", "-", "")
            )
    if cfg.parallel_residual and cfg.out_bias and cfg.mlp_bias:
        n = cfg.d_model - 1 if cfg.norm.startswith("layernorm") else cfg.d_model
        out.append(
            Factor("every layer", "parallel", f"R^{n} b_O ↔ b_out", n, "parallel-bias-trade", "-", "beyond G_max")
        )
    out.append(_stream(cfg))
    return out


def _stream(cfg: Config) -> Factor:
    d = cfg.d_model
    none = "-"
    if cfg.attention_only:  # the continuous inputs are given, not parameters: nothing maps them
        return Factor("stream", "stream", "none (fixed continuous inputs)", 0, "", none, "")
    if cfg.normed_outputs:
        why = "post-norms (γ⊙n(y) enters the stream) block the stream rotation"
        return Factor("stream", "stream", "none (scale only, ε-broken)", 0, "", none, why)
    if cfg.normed_sums:
        return Factor("stream", "stream", "none (post-norm segments)", 0, "", none, "")
    if cfg.tied and cfg.norm in ("layernorm", "rmsnorm"):
        return Factor("stream", "stream", "none (tied + final norm γ)", 0, "", none, "the tied final norm blocks it")
    if cfg.norm == "none":
        return Factor("stream", "stream", f"GL({d}) stream", d * d, "stream-gl", none, "beyond G_max")
    if cfg.norm.startswith("layernorm"):
        n = (d - 1) * (d - 2) // 2
        return Factor("stream", "stream", f"O({d - 1}) on 1^⊥ stream", n, "stream-rotation", none, "beyond G_max")
    return Factor("stream", "stream", f"O({d}) stream", d * (d - 1) // 2, "stream-rotation", none, "beyond G_max")


def total(cfg: Config, fs: list[Factor]) -> int:
    return sum(f.dim * repeats(cfg, f.scope) for f in fs)


def discrete(cfg: Config) -> list[str]:
    if cfg.latent_attention:
        return mla_discrete(as_latent(cfg))
    g = cfg.group_size
    out = [f"head permutations within each KV group (S_{g})^{cfg.n_kv_heads}" if g > 1 else "—"]
    out[0] = out[0] if g > 1 else f"head permutations S_{cfg.n_heads}"
    if cfg.n_kv_heads > 1 and g > 1:
        out.append(f"KV-group permutations S_{cfg.n_kv_heads} (a flat permutation across groups is not one)")
    if not cfg.attention_only:
        out.append(
            f"FFN unit permutations S_{cfg.d_ff}"
            + (f" per expert, expert permutations S_{cfg.experts}" if cfg.experts else "")
        )
    if cfg.qk_norm != "none":
        out.append("sign flips of γ_q/γ_k coordinates per plane")
        if cfg.pos == "rope":
            shared = " (every KV group at once: the weights are shared)" if cfg.qk_norm == "head" else ""
            out.append(
                "RoPE plane turns (ℤ/4 per KV group and plane: a half turn of its q/k rows; a quarter turn "
                f"with its QK-norm entries exchanged{shared})"
            )
    if cfg.act == "swiglu":
        out.append("sign flips of the gated units' linear branch")
    return out


def small(cfg: Config) -> Config:
    """A model with the same switches at sizes a dense Jacobian handles in seconds."""
    if cfg.latent_attention:
        return mla_small(as_latent(cfg))
    kv = min(cfg.n_kv_heads, 2)
    g = min(cfg.group_size, 2)
    ch: dict[str, object] = dict(
        d_model=8,
        n_kv_heads=kv,
        n_heads=kv * g,
        d_head=4,
        d_ff=7,
        vocab=11,
        n_ctx=4,
        n_layers=1,
        rotary_dim=2 if cfg.rotary_dim and cfg.rotary_dim < cfg.d_head else 0,
    )
    if cfg.pos == "rope":
        ch.update(rope_type="default", rope_params=())
    if cfg.experts:
        ch.update(experts=min(cfg.experts, 2), top_k=min(cfg.top_k, 2), d_ff=4)
    if cfg.window:
        ch["window"] = 3
    if cfg.attention_only:
        ch.pop("d_ff"), ch.pop("vocab")
    return cfg.with_(**ch)


@dataclass
class Verification:
    cfg: Config
    measured: int
    explained: int
    factor_total: int
    rows: list[tuple[str, int, int]]  # (family, its factors' formulas summed at this size, family rank)
    others: dict  # families outside the group table: name → rank


def verify(cfg: Config, seed: int = 0) -> Verification:
    from .analysis import analyze

    s = small(cfg)
    r = analyze(s, seed=seed, quiet=True)
    ranks = {f.name: f.rank for f in r.families if f.flat}
    fs = factors(s)
    formula: dict[str, int] = {}  # one family may generate several factors (DeepSeek's dense and MoE FFNs)
    for f in fs:
        if f.source:
            formula[f.source] = formula.get(f.source, 0) + f.dim * repeats(s, f.scope)
    rows = [(k, n, int(ranks.get(k) or 0)) for k, n in formula.items()]
    used = {f.source for f in fs}
    others = {k: v for k, v in ranks.items() if k not in used}
    return Verification(s, r.measured_nullity, r.explained, total(s, fs), rows, others)


@dataclass
class DescribedVerification:
    """The group measured through the per-tensor description (:mod:`..models.described`): every
    candidate family tested for flatness on the family's own forward, as for a derived
    architecture, at ``cfg`` (the small model's switches, at a vocabulary no block makes special)."""

    cfg: Config
    found: Found

    @property
    def agrees(self) -> bool:
        return self.found.agrees


def described_small(cfg: Config, seed: int = 0) -> Config:
    """:func:`small` at sizes its description measures as generic: every learned position used by
    the measurement's sequences (and no other), a vocabulary no first block makes special (a size
    of our choosing need not be).  A configuration the description cannot state raises its line."""
    s = small(cfg)
    if s.pos == "learned":
        s = s.with_(n_ctx=SEQ)
    special = description(s).special_vocabulary(generic_model(s, seed).params)
    return s if special is None else s.with_(vocab=special.safe)


def verify_described(cfg: Config, seed: int = 0) -> DescribedVerification | str:
    """:func:`verify`'s small model measured through its description; what the description cannot
    state, in one line, instead."""
    try:
        s = described_small(cfg, seed)
    except GaugeAuditError as exc:
        return str(exc)
    return DescribedVerification(s, measure(generic_model(s, seed), description(s), seed))


def to_json(cfg: Config, fs: list[Factor]) -> dict:
    return {
        "layers": cfg.n_layers,
        "factors": [{**asdict(f), "repeats": repeats(cfg, f.scope)} for f in fs],
        "total_dimension": total(cfg, fs),
        "discrete": discrete(cfg),
    }
