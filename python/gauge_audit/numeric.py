"""The torch invariance check: apply a gauge action, run both parameter sets on the
same inputs, and compare against a tolerance derived from first principles.

Tolerance (printed with every result)::

    tol = κ(g) · L · K · ε

* ε — machine epsilon of the working dtype;
* K — the sum of the inner-product lengths along one block's path
  (d_model for the Q/K/V and FFN-in projections, d_head for the scores, n for the
  attention average, n_heads·d_head for W_O, d_ff for the FFN-out, d_model for the
  unembedding): each length-k dot product carries at most γ_k ≈ k·ε relative error
  (Higham, Accuracy and Stability of Numerical Algorithms, §3.1);
* L — the number of layers those errors accumulate over (at least 1);
* κ(g) — the condition number of the group element: the transformed weights W·g and
  g⁻¹·W' are each rounded, and the cancellation g·g⁻¹ that makes the function
  invariant happens only up to κ(g) times their rounding.

The error measured is ‖y' − y‖_∞ / ‖y‖_∞.  Elements are applied in float64 and the
transformed parameters then rounded to the working dtype, as a user storing a
gauge-transformed checkpoint would.

That worst-case bound is rigorous but loose: it lets every one of the L·K roundings
push the same way.  Roundings of different operations are, to a very good
approximation, independent with mean zero, so their sum grows like √(L·K), not L·K
(Higham & Mary, SIAM J. Sci. Comput. 41, 2019) — the model the matrix-free nullity
certificate uses too.  The **statistical tolerance**::

    tol_stat = κ(g) · λ · √(L·K) · ε,    λ = √(2·ln(2·N·L·K/δ)),  δ = 10⁻⁶

(N the number of outputs compared; Higham–Mary's bound |error| ≤ λ·√(L·K)·ε fails for
one output with probability ≤ 2·L·K·exp(−λ²/2), so λ as chosen keeps the union over all
N outputs below δ), clamped to the worst-case one.  Verdicts::

    error ≤ tol_stat          HOLDS
    tol_stat < error ≤ tol    HOLDS (worst-case bound only)   — explainable by rounding only
                                                                if the roundings conspire
    error > tol               FAILS
    error ≤ tol, tol ≥ 1      UNDECIDED (tolerance ≥ 1)       — the dtype cannot resolve it

so a rule that is wrong by a little more than rounding (one part in 10¹¹ on MiniLM, say)
no longer passes silently.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from .actions import ACTIONS, Action, Element, get_action
from .actions.base import Special
from .actions.blockwise import transformed
from .errors import GaugeAuditError
from .models import Config, Model, config_of
from .models.params import cast
from .runtime import eps, generator, resolve_dtype

HOLDS, FAILS = "HOLDS", "FAILS"
HOLDS_WORST_CASE_ONLY = "HOLDS (worst-case bound only)"
UNRESOLVED = "UNDECIDED (tolerance ≥ 1)"
FAILURE_PROBABILITY = 1e-6  # δ: chance that independent roundings alone exceed the statistical tolerance


@dataclass
class CheckResult:
    model: str
    action: str
    dtype: str
    device: str
    seed: int
    expected: str  # HOLDS / FAILS: what the theory predicts
    verdict: str  # HOLDS / HOLDS (worst-case bound only) / FAILS: what was measured
    max_rel_error: float
    residual_eps: float  # max_rel_error / ε
    tolerance: float  # the rigorous worst-case tolerance κ·L·K·ε
    tolerance_eps: float
    kappa: float
    tolerance_formula: str
    tolerance_statistical: float = 0.0  # κ·λ·√(L·K)·ε (independent roundings)
    tolerance_statistical_eps: float = 0.0
    tolerance_statistical_formula: str = ""
    routing_changed: int | None = None  # MoE: tokens whose top-k expert set changed
    extra: dict = field(default_factory=dict)
    # Why a contrast that fails generically holds at this parameter point ("" at a generic point):
    # then ``expected`` is HOLDS (see actions/strata.py).
    special: str = ""
    # Why this point cannot test the prediction ("" if it can): a contrast off a special point by
    # less than the tolerance (its failure is smaller than the check resolves), or MoE tokens whose
    # top-k choice was a tie (decided by the experts' labels and rounding, not by the function).
    # Neither verdict contradicts the theory then.
    unresolved: str = ""

    @property
    def holds(self) -> bool:
        """Within the rigorous worst-case bound (HOLDS or HOLDS (worst-case bound only))."""
        return self.verdict in (HOLDS, HOLDS_WORST_CASE_ONLY)

    @property
    def decided(self) -> bool:
        return self.verdict != UNRESOLVED

    @property
    def agrees(self) -> bool:
        """The measurement does not contradict the theory (an undecided one cannot, nor one at a point
        that cannot test the prediction: see ``unresolved``)."""
        return not self.decided or bool(self.unresolved) or self.holds == (self.expected == HOLDS)

    def to_json(self) -> dict:
        return asdict(self)


def path_length(c: Config, n: int) -> tuple[int, str]:
    terms = [("d_model", c.d_model), ("d_head", c.d_head), ("n", n), ("n_heads·d_head", c.n_heads * c.d_head)]
    if not c.attention_only:
        terms += [("d_model", c.d_model), ("d_ff", c.d_ff)]
    if c.normed_inputs and c.normed_outputs:  # the norms after the sublayers (Gemma): a mean of squares each
        terms += [("d_model (post-norms)", 2 * c.d_model)]
    if getattr(c, "qk_norm", "none") != "none":
        terms.append(("d_head (QK-norm)", c.d_head))
    if not c.outputs_stream:
        terms.append(("d_model (unembed)", c.d_model))
    extra = getattr(c, "path_terms", None)  # a family's own inner products (DeepSeek's latents)
    if extra is not None:
        terms += [t for t in extra() if t[1]]
    return sum(v for _, v in terms), " + ".join(f"{k}={v}" for k, v in terms)


def worst_case_tolerance(kappa: float, layers: int, k: int, dtype: torch.dtype) -> float:
    """κ·L·K·ε (L at least 1)."""
    return kappa * max(1, layers) * k * eps(dtype)


def statistical_factor(layers: int, k: int, outputs: int) -> tuple[float, float]:
    """(λ, min(λ·√(L·K), L·K)) with λ = √(2·ln(2·N·L·K/δ)): the statistical tolerance is κ·factor·ε."""
    terms = max(1, layers) * k
    lam = math.sqrt(2.0 * math.log(2.0 * max(1, outputs) * terms / FAILURE_PROBABILITY))
    return lam, min(lam * math.sqrt(terms), terms)


def tolerance(model: Model, kappa: float, dtype: torch.dtype, n: int) -> tuple[float, str]:
    k, k_text = path_length(model.cfg, n)
    layers = max(1, model.cfg.n_layers)
    tol = worst_case_tolerance(kappa, layers, k, dtype)
    return tol, f"κ·L·K·ε = {kappa:.3g}·{layers}·{k}·ε  (K = {k_text})"


def statistical_tolerance(model: Model, kappa: float, dtype: torch.dtype, n: int, outputs: int) -> tuple[float, str]:
    """κ·λ·√(L·K)·ε with λ = √(2·ln(2·N·L·K/δ)) (see the module docstring), at most the
    worst-case κ·L·K·ε."""
    k, _ = path_length(model.cfg, n)
    layers = max(1, model.cfg.n_layers)
    lam, factor = statistical_factor(layers, k, outputs)
    tol = kappa * factor * eps(dtype)
    return tol, (
        f"κ·λ·√(L·K)·ε = {kappa:.3g}·{lam:.3g}·√({layers}·{k})·ε  "
        f"(λ = √(2 ln(2·N·L·K/δ)), N = {outputs} outputs, δ = {FAILURE_PROBABILITY:g})"
    )


def verdict_for(err: float, tol_stat: float, tol: float, routing_changed: int | None = None) -> str:
    """HOLDS within the statistical tolerance, HOLDS (worst-case bound only) between the two,
    FAILS above the worst-case one (or when MoE routing changed).  A worst-case tolerance of 1
    or more (relative) cannot tell any change of the output from rounding — bfloat16 on a deep
    enough path, or an element with a huge κ — so an error below it is UNDECIDED, not HOLDS."""
    if routing_changed or not err <= tol:  # `not <=` also catches NaN
        return FAILS
    if tol >= 1.0:
        return UNRESOLVED
    return HOLDS if err <= tol_stat else HOLDS_WORST_CASE_ONLY


def applicable(model: Model, action: Action) -> str | None:
    return action.applies(model.cfg)


def check(
    model: Model,
    action: Action | str,
    inputs: dict | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype | str = torch.float64,
    kappa: float = 10.0,
    element: Element | None = None,
) -> CheckResult:
    """Apply ``action`` (a random element from ``seed`` unless given) and measure the
    output change.  ``model.params`` must be float64 (they are transformed there)."""
    action = get_action(action) if isinstance(action, str) else action
    reason = action.applies(model.cfg)
    if reason:
        raise GaugeAuditError(f"action {action.name} does not apply to {model.name}: {reason}")
    dtype, inputs = prepare(model, dtype, inputs, seed)
    el = element if element is not None else action.sample(model.cfg, model.params, generator(seed + 1), kappa)
    new = transformed(action, model.cfg, model.params, el)  # block by block for a checkpoint read lazily
    relabel = action.expert_relabel or (lambda el, layer, idx: idx)
    # The prediction at this point: a contrast holds exactly on its special strata (equal norm
    # weights, heads or units nothing reads, one position) — judged at the working dtype's ε.
    expected, nearest = action.expected_at(model.cfg, model.params, positions(inputs), eps(dtype))
    return compare(
        model,
        new,
        inputs,
        el.kappa,
        dtype,
        action.name,
        expected,
        seed,
        lambda layer, idx: relabel(el, layer, idx),
        special=nearest,
    )


def positions(inputs: dict) -> int:
    """The sequence length of a batch of inputs."""
    return next(v for v in inputs.values()).shape[1]


def prepare(model: Model, dtype: torch.dtype | str, inputs: dict | None, seed: int) -> tuple[torch.dtype, dict]:
    """The checks every transformation check shares: float64 parameters (transformed there), all
    finite; the dtype resolved and the inputs drawn from ``seed`` unless given."""
    dtype = resolve_dtype(dtype) if isinstance(dtype, str) else dtype
    if model.dtype != torch.float64:
        raise GaugeAuditError("parameters are transformed in float64; build the model in float64")
    require_finite(model)
    return dtype, (model.sample_inputs(seed) if inputs is None else inputs)


def require_finite(model: Model) -> None:
    """Refuse a model with NaN or infinite parameters (scanned once per Model: MiniLM has 22.6 M)."""
    if not getattr(model, "_finite", False):
        for name, t in model.params.items():
            if not torch.isfinite(t).all():
                raise GaugeAuditError(f"parameter {name} contains NaN or infinite entries")
        model._finite = True


def reference_output(model: Model, inputs: dict, dtype: torch.dtype) -> tuple[torch.Tensor, dict | None]:
    """The output (float64) and MoE routing trace of the model's own parameters, rounded to
    ``dtype``, on ``inputs``.  Every check of a model compares against this same output, so it is
    kept on the model per dtype and reused while the inputs are equal and every parameter is the
    same tensor at the same in-place version (a changed parameter recomputes it).  A lazily read
    checkpoint is cached only when resident (every access the same tensor): listing the tensors
    of any other would read them all."""
    cached = type(model.params) is dict or getattr(model.params, "stable", False)
    store = model.__dict__.setdefault("_reference_outputs", {}) if cached else {}
    hit = store.get(dtype)
    if (
        hit is not None
        and _same_params(hit[0], model.params)
        and hit[1].keys() == inputs.keys()
        and all(torch.equal(hit[1][k], v) for k, v in inputs.items())
    ):
        return hit[2], hit[3]
    trace: dict | None = {} if model.cfg.experts else None
    with torch.no_grad():
        y0 = model.forward(cast(model.params, dtype=dtype), inputs, trace).to(torch.float64)
    if cached:
        state = [(k, weakref.ref(t), t._version) for k, t in model.params.items()]
        store[dtype] = (state, {k: v.clone() for k, v in inputs.items()}, y0, trace)
    return y0, trace


def _same_params(state: list, params: Mapping) -> bool:
    """Is every parameter the tensor recorded (weakly: a freed one never matches) at its version?"""
    if len(state) != len(params):
        return False
    for k, ref, version in state:
        t = ref()
        if t is None or t._version != version or params.get(k) is not t:
            return False
    return True


def compare(
    model: Model,
    new: Mapping,
    inputs: dict,
    kappa: float,
    dtype: torch.dtype,
    label: str,
    expected_holds: bool,
    seed: int,
    relabel=None,
    special: Special | None = None,
    original: tuple[torch.Tensor, dict | None] | None = None,
) -> CheckResult:
    """Run the original and the transformed parameters (both rounded to ``dtype``) on the same
    inputs and judge the change against the derived tolerances for an element of condition
    number ``kappa``.  ``relabel(layer, expert_indices)`` maps the transformed model's MoE expert
    labels back (None: unchanged); ``special``: the nearest special point of a contrast — why the
    prediction is HOLDS here (``expected_holds``), or, off it by a relative defect within the
    tolerance, why the predicted failure cannot be resolved.  ``original``: the model's own
    output and routing trace on ``inputs`` (:func:`reference_output`), computed already (by a
    helper process: ``canonicalize --out``)."""
    y0, trace0 = original if original is not None else reference_output(model, inputs, dtype)
    trace1: dict | None = {} if model.cfg.experts else None  # the router records its choices here
    with torch.no_grad():
        y1 = model.forward(cast(new, dtype=dtype), inputs, trace1).to(torch.float64)
    # logits: is the greedy next token kept? (read before y1 is overwritten)
    tokens = (y0[:, -1].argmax(-1), y1[:, -1].argmax(-1)) if model.cfg.unembed else None
    err = _relative_change(y1, y0)
    n = positions(inputs)
    tol, formula = tolerance(model, kappa, dtype, n)
    e = eps(dtype)
    routing, ties = None, 0
    if trace0 is not None and trace1 is not None:
        # A token whose top-k experts change counts against the transformation — unless its k-th
        # and (k+1)-th router logits were within the tolerance of each other (relative to their
        # rounding scale): such a choice is decided by rounding, like a comparison at a tie, and
        # is reported as a tie instead.
        relabel = relabel or (lambda layer, idx: idx)
        routing = 0
        # the block each trace entry comes from (DeepSeek's first blocks are dense: no entry)
        blocks = trace0.get("routing_layers", range(len(trace0["routing"])))
        for l, (layer, a, b) in enumerate(zip(blocks, trace0["routing"], trace1["routing"])):
            changed = (a.sort(-1).values != relabel(layer, b).sort(-1).values).any(-1)
            tie = trace0["router_margin"][l] <= 2 * tol
            routing += int((changed & ~tie).sum())
            ties += int((changed & tie).sum())
    tol_stat, stat_formula = statistical_tolerance(model, kappa, dtype, n, y0.numel())
    verdict = verdict_for(err, tol_stat, tol, routing)
    extra: dict[str, object] = {"routing_ties": ties} if trace0 is not None else {}
    if tokens is not None:
        before, after = tokens
        extra.update(next_token=before.tolist(), next_token_unchanged=bool(torch.equal(before, after)))
    on, unresolved = "", ""
    if special is not None and expected_holds:
        on = special.reason
    elif special is not None and special.defect <= tol:
        # The rule's violation is first order in the defect (it vanishes on the stratum), so a
        # defect within the tolerance gives a change the check cannot tell from rounding.
        unresolved = (
            f"near a special point: off it by a relative {special.defect:.3g} = {special.defect / e:.3g} ε, "
            f"within the tolerance {tol / e:.3g} ε, so the contrast's failure is not resolved here "
            f"(on it: {special.reason})"
        )
    if expected_holds and verdict == FAILS and not routing and ties:
        # Top-k at a tie picks by label (and rounding): a relabelling or a rounding-level change of
        # the logits may pick other experts, which the invariance of the function does not cover.
        unresolved = (
            f"{ties} token(s) chose their top-k experts at a tie of router logits (within 2·tol), which "
            "the experts' labels and rounding decide, not the function: no invariance is predicted there"
        )
    return CheckResult(
        model.name,
        label,
        str(dtype).replace("torch.", ""),
        str(model.device),
        seed,
        HOLDS if expected_holds else FAILS,
        verdict,
        err,
        err / e,
        tol,
        tol / e,
        kappa,
        formula,
        tol_stat,
        tol_stat / e,
        stat_formula,
        routing,
        extra=extra,
        special=on,
        unresolved=unresolved,
    )


def _relative_change(y1: torch.Tensor, y0: torch.Tensor) -> float:
    """‖y1 − y0‖_∞ / ‖y0‖_∞, overwriting ``y1`` (the transformed output, not needed afterwards).

    Maxima are exact whatever the order of the reduction, so this equals
    ``(y1 - y0).abs().max() / y0.abs().max()`` bit for bit, without the temporaries of the
    output's size (for Gemma 3's 262 144-entry vocabulary 134 MB each, page-faulted in afresh):
    a maximum of absolute values is finite exactly when every entry is."""
    scale = torch.linalg.vector_norm(y0, float("inf"))
    if not (math.isfinite(float(scale)) and math.isfinite(float(torch.linalg.vector_norm(y1, float("inf"))))):
        raise GaugeAuditError("the forward pass produced NaN or infinite values")
    return float(torch.linalg.vector_norm(y1.sub_(y0), float("inf")) / scale)


def pairs(models: list[str]) -> list[tuple[str, str]]:
    """Every (model, action) pair where the action applies, in table order."""
    return [(m, a.name) for m in models for a in ACTIONS.values() if a.applies(config_of(m)) is None]
