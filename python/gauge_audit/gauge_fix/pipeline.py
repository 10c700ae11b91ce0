"""The canonicalisation pipeline: the steps in order, the conditions they impose, what is left
unfixed, and the :class:`Canonical` result.

Order (each step's condition is invariant under the groups of the steps after it):

 1 norm-scale        γ = 1                              8 stream rotation   Gram of W_E diagonal
 2 norm-shift        β = 0 (β = γ: unbiased readers)    9 head-perm         heads sorted
 3 ln-reader-ones    γᵀ·W[:, j] = 0                    10 expert-perm       experts sorted
 4 router-offset     W_router·1 = 0                    11 ffn-perm          units sorted
 5 embed-offset      mean row of W_pos (W_tt) = 0      12 qk-gl             balanced score factors
 6 biases            openings, b_K, b_V, P·b_out = 0      (QK-norm: qk-norm-scale, ‖γ_q‖ = ‖γ_k‖ per unit)
 7 ln-writer-ones    writer rows ⊥ 1                   13 vo-gl             balanced output factors
                                                       14 relu/swiglu       balanced units

The newer architectures change which steps act, not the order: a partial rotary splits qk-gl into
the planes' scalars and a GL on the unrotated coordinates; a QK-norm replaces qk-gl by the
rescaling of its weights; sandwich norms (Gemma) and normed sublayer outputs (OLMo 2) block the
stream rotation and leave norm-scale the pre-norms (resp. the final norm only); a parallel
residual, sliding windows, RoPE scaling tables, soft-capping, Gemma's √d embedding scale and
(1 + w) norm weights (held as the effective γ) leave every group as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..actions import Element, composite
from ..errors import GaugeAuditError
from ..models import Config, Model, family_of, param_shapes
from ..models.deepseek import DeepseekConfig, as_latent
from ..models.lazy import LazyParams
from ..numeric import compare, reference_output
from ..runtime import eps, one_thread
from . import ffn, heads, mla, qk_norm, stream
from .base import Context, Params, StepRecord, rounding_kappa

# (step, the fix, {nullity family: its condition function}) in pipeline order
STEPS: tuple = (
    (
        "norm-scale",
        stream.fix_norm_scale,
        {"norm-scale": stream.cond_norm_scale, "final-norm-scale": stream.cond_final_norm_scale},
    ),
    ("norm-shift", stream.fix_norm_shift, {"norm-shift": stream.cond_norm_shift}),
    ("ln-reader-ones", stream.fix_reader_ones, {"ln-reader-ones": stream.cond_reader_ones}),
    ("router-offset", stream.fix_router_offset, {"router-offset": stream.cond_router_offset}),
    ("embed-offset", stream.fix_embed_offset, {"embed-offset": stream.cond_embed_offset}),
    (
        "biases",
        stream.fix_bias_chain,
        {
            "stream-translation": stream.cond_segments,
            "key-bias-shift": stream.cond_key_bias,
            "value-bias-fold": stream.cond_value_bias,
            "parallel-bias-trade": stream.cond_parallel_bias,
        },
    ),
    ("ln-writer-ones", stream.fix_writer_ones, {"ln-writer-ones": stream.cond_writer_ones}),
    ("stream-rotation", stream.fix_stream_rotation, {"stream-rotation": stream.cond_stream_rotation}),
    ("latent-norm-scale", mla.fix_latent_norm_scale, {"latent-norm-scale": mla.cond_latent_norm_scale}),
    ("latent-rotation", mla.fix_latent_rotation, {"latent-rotation": mla.cond_latent_rotation}),
    ("head-perm", heads.fix_head_perm, {}),
    ("mla-head-perm", mla.fix_mla_head_perm, {}),
    ("expert-perm", ffn.fix_expert_perm, {}),
    ("ffn-perm", ffn.fix_ffn_perm, {}),
    ("qk-gl", heads.fix_qk, {"qk-gl": heads.cond_qk}),
    ("qk-norm-scale", qk_norm.fix_qk_norm, {"qk-norm-scale": qk_norm.cond_qk_norm}),
    ("qk-plane-turn", qk_norm.fix_qk_planes, {}),
    ("vo-gl", heads.fix_vo, {"vo-gl": heads.cond_vo}),
    # the shared-key commutant before the per-head GLs: its phase decision is then taken before any
    # dense element, at the same threshold in every run of blocks (compare by runs)
    ("mla-rope-commutant", mla.fix_rope, {"mla-rope-commutant": mla.cond_rope}),
    ("mla-nope-gl", mla.fix_nope, {"mla-nope-gl": mla.cond_nope}),
    ("mla-vo-gl", mla.fix_mla_vo, {"mla-vo-gl": mla.cond_mla_vo}),
    ("scaling", ffn.fix_scaling, {"relu-scaling": ffn.cond_scaling, "swiglu-scaling": ffn.cond_scaling}),
)


def conditions(cfg: Config, params: Params, skip: frozenset = frozenset()) -> dict[str, torch.Tensor]:
    """Every gauge condition the continuous steps impose, by the nullity family it fixes: a
    differentiable function of the parameters, zero at a canonical point (not those of the
    families in ``skip``)."""
    out = {}
    for _, _, conds in STEPS:
        for family, fn in conds.items():
            if family in skip or (family.endswith("-scaling") and family != ffn.scaling_family(cfg)):
                continue
            c = fn(cfg, params)
            if c is not None and c.numel():
                out[family] = c
    return out


def unfixed(cfg: Config) -> list[tuple[str, str]]:
    """Continuous families of the nullity theory this pipeline does not fix here, with the reason."""
    out = []
    pre = not cfg.attention_only and cfg.pre_norm
    if pre and cfg.norm == "none" and not cfg.tied:
        out.append(("stream-gl", "GL(d) of a norm-free stream: no canonical step yet"))
    biased = cfg.attn_bias and cfg.out_bias and (cfg.attention_only or cfg.mlp_bias)
    stretches = (
        (cfg.attention_only and cfg.n_layers > 1)
        or (pre and cfg.norm == "none")
        or (not cfg.attention_only and cfg.normed_sums and cfg.norm == "layernorm")
    )
    if stretches and (not biased or cfg.experts or (pre and cfg.tied)):
        out.append(
            (
                "stream-translation",
                "stretches of stream whose readers lack biases (the shift is absorbed "
                "through reader weights or constrained): no canonical step yet",
            )
        )
    if not cfg.attention_only and cfg.norm != "none" and cfg.norm_eps == 0:
        out.append(
            (
                "stream-scale" if cfg.pre_norm else "segment-scale",
                "a symmetry only at norm ε = 0: not fixed",
            )
        )
    if pre and cfg.pos != "learned" and cfg.vocab < cfg.d_model:
        out.append(
            (
                "first-block",
                "vocab < d_model: block 0 reads the stream at finitely many points "
                "(unreached-readers, bias-trade, input-offset, tied-unembed-null): not fixed",
            )
        )
    for family, entries, count in _token_tables(cfg):
        out.append(
            (
                family,
                f"block 0 reads the stream at the {cfg.vocab} vocab points and its table ({entries} numbers) "
                f"is smaller than its {count} parameters: flat directions of a finite table, no group action, "
                "not fixed",
            )
        )
    if _tied_table(cfg):
        out.append(
            (
                "tied-table-rotation",
                f"tied, and block 0's table at the {cfg.vocab} vocab points re-solves for a moved W_E: "
                "a stream rotation the tied final norm allows only through that table, no group action, "
                "not fixed",
            )
        )
    if cfg.latent_attention:
        return out + _deepseek_unfixed(as_latent(cfg))
    if cfg.experts and cfg.top_k == 1:
        out.append(
            ("router-top1", "top-1 routing: every router weight is locally flat; only the router offset is fixed")
        )
    return out


def _deepseek_unfixed(cfg: DeepseekConfig) -> list[tuple[str, str]]:
    """DeepSeek's families that are no group action (or only one at ε = 0)."""
    out = []
    moe = cfg.experts and any(cfg.moe_layer(i) for i in range(cfg.n_layers))
    if moe and cfg.router == "sigmoid":
        out.append(
            (
                "router-bias-selection",
                "the score-correction bias only selects experts: locally flat where the selection is constant, "
                "no group action, not fixed",
            )
        )
        if cfg.top_k == 1 and cfg.router_renorm:
            out.append(("router-top1", "top-1 routing with renormalised gates: every router weight only selects"))
    if cfg.latent_eps == 0:
        out.append(("latent-input-scale", "a symmetry only at latent norm ε = 0: not fixed"))
    return out


def _token_tables(cfg: Config) -> list[tuple[str, int, int]]:
    """(family, table entries, sublayer parameters) for every block-0 table of
    :mod:`gauge_audit.nullity.families.token_tables` that has fewer entries than the parameters it
    is a function of — where the theory finds its token-table families (the null space of the
    table's Jacobian outside the families above: with fewer rows than columns it is non-empty
    unless those families fill it).  Under the same preconditions: no learned positions, no MoE,
    vocab ≤ 4096, a parallel residual (the FFN's table) or normed sublayer outputs (the scores and
    values of the first attention)."""
    if cfg.attention_only or cfg.pos == "learned" or cfg.experts or cfg.vocab > 4096:
        return []
    shapes = {k: math.prod(shape) for k, (shape, _) in param_shapes(cfg).items()}
    if "embed.W_E" not in shapes:
        return []

    def count(names) -> int:
        return sum(shapes.get(n, 0) for n in names)

    attn, d, v = "blocks.0.attn", cfg.d_model, cfg.vocab
    heads = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head
    out = []
    if cfg.pre_norm and cfg.parallel_residual:
        names = [] if cfg.tied else ["embed.W_E"]
        names += [f"{attn}.{n}" for n in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V")]
        names += [n for n in shapes if n.startswith(("blocks.0.ln1.", "blocks.0.ln2.", "blocks.0.mlp."))]
        out.append(("token-table-ffn", v * (heads + d), count(names)))
    if cfg.normed_outputs and not cfg.normed_inputs:
        n = cfg.n_ctx
        pairs = n * (n + 1) // 2 - (max(0, n - cfg.window) * (n - cfg.window + 1) // 2 if cfg.window else 0)
        qk = [f"{attn}.{k}" for k in ("W_Q", "b_Q", "W_K", "b_K", "q_norm", "k_norm")]
        vo = [f"{attn}.{k}" for k in ("W_V", "b_V", "W_O", "b_O")]
        out.append(("token-table-scores", cfg.n_heads * v * v * pairs, count(qk)))
        out.append(("token-table-values", cfg.n_heads * v * d + (d if f"{attn}.b_O" in shapes else 0), count(vo)))
    return [(f, entries, params) for f, entries, params in out if entries < params]


def _tied_table(cfg: Config) -> bool:
    """Where the theory finds tied-table-rotation (:func:`~gauge_audit.nullity.families.token_tables.
    tied_table_family`): a tied parallel block 0 under an affine LayerNorm reading d_model < vocab
    points, where its dimension formula is positive (the formula's regime, an FFN that sets its stream
    table at will, holds at every size the theory is measured at but the narrowest FFNs)."""
    parallel = not cfg.attention_only and cfg.pre_norm and cfg.parallel_residual
    if not (parallel and cfg.tied and cfg.norm == "layernorm" and cfg.pos != "learned" and not cfg.experts):
        return False
    if not cfg.d_model < cfg.vocab <= 4096:
        return False
    # imported here: the nullity package brings SymPy (half a second at every start of canonicalize
    # and compare), and only this narrow configuration needs the formula
    from ..nullity.families.token_tables import tied_table_dimension

    return tied_table_dimension(cfg.d_model, cfg.vocab) > 0


@dataclass
class Canonical:
    """A canonical form g·θ: the parameters (float64), the applied steps (g is their product, in
    order), the families not fixed, and the storage precision of the input."""

    cfg: Config
    params: Params
    records: list[StepRecord]
    unfixed: list[tuple[str, str]]
    storage_dtype: torch.dtype
    notes: list[str] = field(default_factory=list)
    # per family (number of conditions, largest |residual|), where they were measured piece by
    # piece instead of from ``params`` (:mod:`.by_runs`)
    condition_stats: dict[str, tuple[int, float]] | None = None

    @property
    def kappa(self) -> float:
        """κ(g): the product of every step's κ."""
        return math.prod(r.element.kappa for r in self.records)

    @property
    def rounding_kappa(self) -> float:
        """The κ that amplifies rounding: the product over the dense steps only (diagonal scalings
        such as norm-scale's γ folding keep every |x|·|W| product, :data:`.base.DIAGONAL`)."""
        return rounding_kappa(self.records)

    def element(self) -> Element:
        """g as one composite element (``gauge-audit check --action composite --element``)."""
        return composite.make([(r.action, r.element) for r in self.records])

    def condition_counts(self) -> dict[str, int]:
        if self.condition_stats is not None:
            return {k: n for k, (n, _) in self.condition_stats.items()}
        return {k: int(v.numel()) for k, v in conditions(self.cfg, self.params).items()}

    def ties(self) -> list[dict]:
        return [{"step": r.family, **d.to_json()} for r in self.records for d in r.decisions if not d.unique]

    def report(self) -> dict:
        if self.condition_stats is not None:
            counts = {k: n for k, (n, _) in self.condition_stats.items()}
            residuals = {k: r for k, (_, r) in self.condition_stats.items()}
        else:
            conds = conditions(self.cfg, self.params)
            counts = {k: int(v.numel()) for k, v in conds.items()}
            residuals = {k: float(v.abs().max()) for k, v in conds.items()}
            del conds
        steps = []
        for r in self.records:
            steps.append(
                {
                    "family": r.family,
                    "action": r.action,
                    "condition": r.condition,
                    "kappa": r.element.kappa,
                    "decisions": [d.to_json() for d in r.decisions],
                    "notes": r.notes,
                }
            )
        return {
            "storage_dtype": str(self.storage_dtype).replace("torch.", ""),
            "conditions": counts,
            "conditions_total": sum(counts.values()),
            "condition_residual_max": residuals,
            "kappa": self.kappa,
            "rounding_kappa": self.rounding_kappa,
            "steps": steps,
            "not_unique": self.ties(),
            "notes": [n for r in self.records for n in r.notes] + self.notes,
            "unfixed": [{"family": f, "reason": why} for f, why in self.unfixed],
        }


def validate(cfg: Config, params: Params) -> None:
    """One-line errors for parameters that do not fit the architecture or are not finite."""
    expected = param_shapes(cfg)
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    if missing or extra:
        raise GaugeAuditError(
            f"parameters do not match the {cfg.family} layout: "
            f"missing {missing[:3]}{'…' if len(missing) > 3 else ''}, "
            f"unexpected {extra[:3]}{'…' if len(extra) > 3 else ''}"
        )
    for name, (shape, _) in expected.items():
        if isinstance(params, LazyParams):  # read on access: shapes known, each tensor checked as it is read
            if tuple(params.shapes[name]) != tuple(shape):
                raise GaugeAuditError(
                    f"parameter {name} has shape {tuple(params.shapes[name])}, expected {tuple(shape)}"
                )
            continue
        if tuple(params[name].shape) != tuple(shape):
            raise GaugeAuditError(f"parameter {name} has shape {tuple(params[name].shape)}, expected {tuple(shape)}")
        if not params[name].is_floating_point() or not torch.isfinite(params[name]).all():
            raise GaugeAuditError(f"parameter {name} contains NaN or infinite entries")


def storage_dtype_of(params: Params) -> torch.dtype:
    """The coarsest floating dtype among the parameters (what the model was stored in).  Parameters
    read on access that convert every tensor to their one dtype have that dtype: read from them
    without loading every tensor (for a GGUF model, dequantizing it once more only to look)."""
    if isinstance(params, LazyParams) and type(params).__getitem__ is LazyParams.__getitem__:
        return params.dtype
    return max((t.dtype for t in params.values()), key=lambda d: torch.finfo(d).eps)


# the discrete choices a rounding probe reuses from the unperturbed run
PERMUTATIONS = (
    "head-perm",
    "mla-head-perm",
    "expert-perm",
    "deepseek-expert-perm",
    "ffn-perm",
    "deepseek-ffn-perm",
    "qk-plane-turn",
)
ROTATION = "stream-rotation"  # the family of the one step whose element is shared by every block


def permutations(records: list[StepRecord]) -> list[StepRecord]:
    """The permutations among ``records``: the discrete choices a probe or a run given them reuses."""
    return [r for r in records if r.family in PERMUTATIONS]


def kept_permutations(records: list[StepRecord]) -> dict[str, Element]:
    """The permutations among ``records``, by family."""
    return {r.family: r.element for r in permutations(records)}


def rotation_index(records: list[StepRecord]) -> int | None:
    """Where the stream rotation is among ``records`` (None where there is none)."""
    return next((i for i, r in enumerate(records) if r.family == ROTATION), None)


def stream_rotation(records: list[StepRecord]) -> Element | None:
    """The stream rotation's element among ``records`` (None where there is none)."""
    i = rotation_index(records)
    return None if i is None else records[i].element


def canonicalize(
    cfg: Config,
    params: Params,
    *,
    reference: Params | None = None,
    storage_dtype: torch.dtype | None = None,
    frozen: Canonical | None = None,
) -> Canonical:
    """The canonical form of ``params`` (any floating dtype; computed in float64 on the CPU).

    ``reference``: another canonical form of the same architecture; the compact residual freedoms
    (rotations of balanced factors, signs, phases, permutations) are then aligned to it instead of
    fixed by their rules (see :func:`gauge_audit.gauge_fix.compare`).  ``frozen``: the canonical
    form of the unperturbed model, whose permutations are reused (rounding-response probes)."""
    validate(cfg, params)
    dtype = storage_dtype or storage_dtype_of(params)
    return canonicalize_owned(
        cfg,
        {k: v.detach().to("cpu", torch.float64) for k, v in params.items()},
        reference=reference,
        storage_dtype=dtype,
        frozen=frozen,
    )


def canonicalize_owned(
    cfg: Config,
    p64: Params,
    *,
    reference: Params | None,
    storage_dtype: torch.dtype,
    frozen: Canonical | None = None,
    whole: bool = False,
    keep: dict[str, Element] | None = None,
) -> Canonical:
    """:func:`canonicalize` of validated float64 parameters in a dict the caller hands over: the
    steps replace its tensors in place, block by block (:func:`.base.apply_in_place`), so the
    input is not kept beside the result.  ``whole``: each step with the whole-model rule instead
    (a new dict per step; the same result, kept to check the in-place path against).  ``keep``:
    elements applied as given instead of computed, by family (``frozen``'s permutations, the
    stream rotation of a run of blocks: :mod:`.response`)."""
    with one_thread():
        if frozen is not None:
            keep = kept_permutations(frozen.records)
        ctx = Context(cfg, p64, reference, eps(storage_dtype) / 2, keep, whole)
        for _, fix, _ in STEPS:
            fix(ctx)
    return Canonical(cfg, ctx.params, ctx.records, unfixed(cfg), storage_dtype)


def _before_model(cfg: Config, before: Params, dtype: torch.dtype) -> Model:
    # stored in another precision: converted block by block as the forward reads it, not as one
    # more copy of the whole model
    if isinstance(before, LazyParams):
        before = before.cast(dtype)
    elif any(v.dtype != dtype for v in before.values()):
        before = LazyParams({k: tuple(v.shape) for k, v in before.items()}, before.__getitem__, dtype)
    return Model("canonical", cfg, before, family_of(cfg))


def original_output(
    cfg: Config, before: Params, seed: int = 0, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, dict | None]:
    """The output (and MoE routing trace) of ``before`` that :func:`function_check` compares the
    canonical form's against: the same computation, for a helper process to do ahead."""
    model = _before_model(cfg, before, dtype)
    return reference_output(model, model.sample_inputs(seed), dtype)


def function_check(
    cfg: Config,
    before: Params,
    after: Params,
    kappa: float,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    element: Element | None = None,
    original: tuple[torch.Tensor, dict | None] | None = None,
) -> dict:
    """Run both parameter sets on the same seeded inputs (:func:`gauge_audit.numeric.compare`):
    the max relative output change against the derived tolerances (worst case κ·L·K·ε,
    statistical κ·λ·√(L·K)·ε) and the verdict.  ``element``: the composite mapping ``before``
    to ``after`` (:meth:`Canonical.element`), through which MoE expert labels are compared.
    ``original``: :func:`original_output` of ``before``, computed already."""
    model = _before_model(cfg, before, dtype)
    relabel = None
    if element is not None:
        relabel_of = composite.ACTIONS[0].expert_relabel
        assert relabel_of is not None  # the composite relabels the experts its steps permute
        relabel = lambda layer, idx: relabel_of(element, layer, idx)  # noqa: E731
    r = compare(
        model, after, model.sample_inputs(seed), kappa, dtype, "canonical form", True, seed, relabel, original=original
    )
    return {
        "max_rel_error": r.max_rel_error,
        "residual_eps": r.residual_eps,
        "tolerance_eps": r.tolerance_eps,
        "tolerance_statistical_eps": r.tolerance_statistical_eps,
        "kappa": kappa,
        "formula": r.tolerance_formula,
        "verdict": r.verdict,
        "routing_changed": r.routing_changed,
    }
