"""Gauge-invariance assertions for your own test suite (as e3nn's ``assert_equivariant``).

::

    from gauge_audit.testing import assert_gauge_invariant

    rule = {"scope": "head", "elements": {"N": "GL(d_v)"},
            "maps": {"W_V": "W_V @ N", "W_O": "inv(N) @ W_O"}}
    assert_gauge_invariant(forward, params, rule, inputs=x,
                           names={"W_V": {"key": "v_proj.weight", "linear": True, "heads": 4},
                                  "W_O": {"key": "o_proj.weight", "linear": True, "heads": 4}})

* ``forward(params, inputs)`` is any callable returning a tensor (an ``nn.Module`` wrapped as
  ``lambda p, x: torch.func.functional_call(module, p, (x,))`` works);
* ``params`` a dict of tensors (the module's ``state_dict()`` or ``named_parameters()``);
* ``rule`` the ``[claim.rule]`` table as a dict (or a parsed :class:`~gauge_audit.claims.rule.Rule`);
* ``names`` maps the rule's parameter names (``W_Q``, ``W_O``, ``b_V``, ``norm1.w`` ...) onto your keys:
  a key string (the tensor in the rule's row-vector convention y = x·W, with a leading head axis
  for per-head names if it has one), or a dict ``{"key": ..., "linear": True}`` for an
  ``nn.Linear`` weight stored (out, in) (y = x·Wᵀ), ``"heads": h`` to split fused heads
  (columns of W_Q / W_K / W_V and their biases, rows of W_O); ``{layer}`` in a key stands for the
  layer index (``"blocks.{layer}.attn.q.weight"``).  Default: the rule's names themselves.
* ``dims`` gives dimensions the tensors do not show (e.g. ``{"d_ff": 64}``).

The elements are drawn from ``seed`` with condition number ``kappa``, the rule is applied in
float64 (the same engine as ``gauge-audit``), both parameter sets are cast to ``dtype`` and run on
the same inputs, and the relative change ‖y′ − y‖∞/‖y‖∞ is compared with the derived tolerances of
:mod:`gauge_audit.numeric`: κ·L·K·ε (worst case) and κ·λ·√(L·K)·ε (statistical), K the summed
inner-product lengths of one block (d_model + d_k + n + n_heads·d_v [+ d_model + d_ff with an
FFN] [+ d_model with an unembedding]), L the layers.  :class:`AssertionError` reports the residual
in ε, both tolerances and κ.  A rule that touches no tensor of ``params`` is an error, never a pass.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .claims.rule import ROTARY, Rule, parse_rule
from .errors import GaugeAuditError
from .models.naming import FFN_NAMES, HEAD, KV, MODEL, PARAMS
from .numeric import FAILS, HOLDS, HOLDS_WORST_CASE_ONLY, statistical_factor, verdict_for, worst_case_tolerance
from .rules.algebra import TorchOps
from .rules.engine import Ctx, NotApplicable, Shape, View, applicability, apply, sandwich_kappa
from .rules.torch_check import draw
from .runtime import eps


@dataclass
class GaugeCheck:
    """What :func:`gauge_residual` measured."""

    verdict: str  # HOLDS / HOLDS (worst-case bound only) / FAILS
    max_rel_error: float
    residual_eps: float
    tolerance_eps: float  # worst case κ·L·K·ε, in ε
    tolerance_statistical_eps: float
    kappa: float
    layers: int
    path_length: int
    dtype: str
    touched: list[str]  # the user's keys the rule changed

    def message(self) -> str:
        return (
            f"max relative output change {self.max_rel_error:.3e} = {self.residual_eps:.4g} ε; tolerance "
            f"{self.tolerance_statistical_eps:.4g} ε statistical (κ·λ·√(L·K)·ε), {self.tolerance_eps:.4g} ε "
            f"worst case (κ·L·K·ε); κ = {self.kappa:.4g}, L = {self.layers}, K = {self.path_length}, "
            f"dtype {self.dtype}; changed {', '.join(self.touched)}"
        )


@dataclass(frozen=True)
class _Spec:
    key: str
    linear: bool = False
    heads: int | None = None  # fused heads to split


def _spec(value) -> _Spec:
    if isinstance(value, str):
        return _Spec(value)
    if isinstance(value, Mapping) and isinstance(value.get("key"), str):
        unknown = set(value) - {"key", "linear", "heads"}
        if unknown:
            raise GaugeAuditError(f"names: unknown option(s) {', '.join(sorted(unknown))} (key, linear, heads)")
        return _Spec(value["key"], bool(value.get("linear", False)), value.get("heads"))
    raise GaugeAuditError(f"names: expected a key or a dict with 'key', got {value!r}")


class UserView(View):
    """A user's parameter dict seen through ``names`` (see the module doc)."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        names: Mapping[str, object],
        dims: Mapping[str, int],
        layers: int | None,
        planes: tuple = (),
    ):
        self.params = params
        self.specs = {n: _spec(v) for n, v in names.items()}
        for n in self.specs:
            if n not in PARAMS:
                raise GaugeAuditError(f"names: unknown rule parameter {n!r} (known: {', '.join(PARAMS)})")
        self.n_layers = layers if layers is not None else self._count_layers()
        self.ops = TorchOps()
        n_heads, n_kv = self._heads()
        self.shape = Shape(self._dims(dict(dims), n_heads, n_kv), self.n_layers, n_heads, n_kv, 0, False, planes)

    # -- layout -------------------------------------------------------------------------------
    def _key(self, name: str, layer: int | None) -> str:
        key = self.specs[name].key
        return key.replace("{layer}", str(layer if layer is not None else 0))

    def _count_layers(self) -> int:
        templated = [s.key for s in self.specs.values() if "{layer}" in s.key]
        if not templated:
            return 1
        n = 0
        while any(t.replace("{layer}", str(n)) in self.params for t in templated):
            n += 1
        if n == 0:
            raise GaugeAuditError(f"names: no key matches {templated[0]!r} for layer 0")
        return n

    def unmatched(self) -> dict[str, str]:
        """The names whose key is in no parameter (layer 0 for per-layer keys) → that key."""
        out = {}
        for name in self.specs:
            key = self._key(name, 0 if PARAMS[name].level != MODEL else None)
            if key not in self.params:
                out[name] = key
        return out

    def has(self, name: str) -> bool:
        if name not in self.specs:
            return False
        lay = 0 if PARAMS[name].level != MODEL else None
        return self._key(name, lay) in self.params

    def _tensor(self, name: str, layer) -> torch.Tensor:
        """The tensor in the row-vector convention with a leading head axis for per-head names."""
        spec = self.specs[name]
        t = self.params[self._key(name, layer)].detach().to("cpu", torch.float64)
        if spec.linear and t.dim() >= 2:
            t = t.transpose(-1, -2)  # nn.Linear stores (out, in): y = x·Wᵀ
        p = PARAMS[name]
        if p.level in (HEAD, KV):
            vector = p.shape[0] == 1
            if spec.heads:
                h = spec.heads
                if vector:
                    t = t.reshape(h, -1)
                elif name == "W_O":
                    t = t.reshape(h, -1, t.shape[-1])
                else:
                    t = t.reshape(t.shape[0], h, -1).permute(1, 0, 2)
            elif t.dim() == (1 if vector else 2):
                t = t.unsqueeze(0)
        return t

    def _heads(self) -> tuple[int, int]:
        counts: dict[int, list] = {HEAD: [], KV: []}
        for name in self.specs:
            p = PARAMS[name]
            if p.level in counts and self.has(name):
                counts[p.level].append(self._tensor(name, 0).shape[0])
        for level, vals in counts.items():
            if len(set(vals)) > 1:
                raise GaugeAuditError(
                    f"names: inconsistent head counts {sorted(set(vals))} for "
                    f"{'query' if level == HEAD else 'KV'} heads"
                )
        h = counts[HEAD][0] if counts[HEAD] else (counts[KV][0] if counts[KV] else 1)
        kv = counts[KV][0] if counts[KV] else h
        if h % kv:
            raise GaugeAuditError(f"names: {h} query heads cannot share {kv} KV heads")
        return h, kv

    def _dims(self, dims: dict, n_heads: int, n_kv: int) -> dict:
        out = {"n_heads": n_heads, "n_kv_heads": n_kv, "n_experts": 0}
        for name in self.specs:
            if not self.has(name):
                continue
            t = self._tensor(name, 0)
            got = tuple(t.shape[-2:]) if t.dim() >= 2 else (1, t.shape[-1])
            if PARAMS[name].shape[0] == 1:
                got = (1, t.shape[-1])
            for want, value in zip(PARAMS[name].shape, got):
                if isinstance(want, str):
                    if out.get(want, value) != value:
                        raise GaugeAuditError(f"names: {name} gives {want} = {value}, elsewhere {out[want]}")
                    out[want] = value
        for k, v in dims.items():
            if k in out and out[k] != v:
                raise GaugeAuditError(f"dims: {k} = {v}, but the tensors give {out[k]}")
            out[k] = int(v)
        return out

    def raw(self, name: str, ctx: Ctx) -> torch.Tensor:
        t = self._tensor(name, ctx.layer)
        p = PARAMS[name]
        if p.level == HEAD:
            t = t[ctx.head]
        elif p.level == KV:
            t = t[ctx.kv]
        return t if t.dim() == 2 else t.reshape(1, -1)

    def updated(self, changes: dict) -> dict:
        out = dict(self.params)
        grouped: dict[tuple, dict] = {}
        for (name, ctx), value in changes.items():
            grouped.setdefault((name, ctx.layer), {})[ctx] = value
        for (name, layer), vals in grouped.items():
            key = self._key(name, layer)
            full = self._tensor(name, layer).clone()
            p = PARAMS[name]
            for ctx, v in vals.items():
                if p.level == HEAD:
                    full[ctx.head] = v.reshape(full[ctx.head].shape)
                elif p.level == KV:
                    full[ctx.kv] = v.reshape(full[ctx.kv].shape)
                else:
                    full = v.reshape(full.shape)
            out[key] = self._restore(name, full, self.params[key])
        return out

    def _restore(self, name: str, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Back into the user's layout, dtype and device."""
        spec = self.specs[name]
        p = PARAMS[name]
        if p.level in (HEAD, KV):
            vector = p.shape[0] == 1
            if spec.heads:
                if vector or name == "W_O":
                    t = t.reshape(-1) if vector else t.reshape(-1, t.shape[-1])
                else:
                    t = t.permute(1, 0, 2).reshape(t.shape[1], -1)
            elif like.dim() == (1 if vector else 2):  # no head axis in the user's tensor
                t = t[0]
        if spec.linear and t.dim() >= 2:
            t = t.transpose(-1, -2)
        return t.reshape(like.shape).to(device=like.device, dtype=like.dtype)


def _as_rule(rule) -> Rule:
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, Mapping):
        return parse_rule(dict(rule))
    raise GaugeAuditError("rule must be a parsed Rule or a dict shaped like the [claim.rule] table")


def _cast(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, Mapping):
        return {k: _cast(v, dtype) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _seq_len(inputs) -> int:
    t = inputs
    while not isinstance(t, torch.Tensor):
        if isinstance(t, Mapping):
            t = next(iter(t.values()))
        elif isinstance(t, (tuple, list)):
            t = t[0]
        else:
            return 1
    if t.is_floating_point():
        return t.shape[-2] if t.dim() >= 2 else 1
    return t.shape[-1]


def _path_length(view: UserView, n: int) -> int:
    d = view.shape.dims
    k = d.get("d_model", 0) + d.get("d_k", 0) + n + d["n_heads"] * d.get("d_v", d.get("d_k", 0))
    if any(x in view.specs for x in FFN_NAMES):
        k += d.get("d_model", 0) + d.get("d_ff", 0)
    if "W_U" in view.specs:
        k += d.get("d_model", 0)
    return max(1, k)


def _refuse_unmatched(unmatched: Mapping[str, str], params: Mapping[str, torch.Tensor]) -> None:
    if not unmatched:
        return
    parts = []
    for name, key in unmatched.items():
        close = difflib.get_close_matches(key, list(params), n=1)
        parts.append(f"{name} → {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise GaugeAuditError(f"names: no parameter matches {'; '.join(parts)}")


def gauge_residual(
    forward: Callable,
    params: Mapping[str, torch.Tensor],
    rule,
    *,
    inputs,
    names=None,
    dims=None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    kappa: float = 10.0,
    layers: int | None = None,
    path_length: int | None = None,
    rotary_planes=None,
) -> GaugeCheck:
    """Measure how much ``rule`` changes ``forward`` (see the module doc); raises
    :class:`~gauge_audit.errors.GaugeAuditError` for a rule that cannot act on these tensors.
    ``rotary_planes``: the pairs (i, j) of a head's coordinates that RoPE rotates together (``[]``
    without RoPE) — required by the rotary groups, which are defined by them."""
    r = _as_rule(rule)
    if rotary_planes is None and any(e.group in ROTARY for e in r.elements):
        raise GaugeAuditError(
            "the rotary groups are defined by the model's rotary planes: pass rotary_planes=[(i, j), ...] "
            "(the pairs of a head's coordinates RoPE rotates together; [] for a model without RoPE)"
        )
    given = names is not None
    names = names if given else {n: n for n in r.referenced}
    planes = tuple((int(i), int(j)) for i, j in (rotary_planes or ()))
    view = UserView(params, names, dims or {}, layers, planes)
    if given:
        # a key the caller named must exist: a typo would otherwise read as "this model has no such
        # parameter" and the rule would be checked on the rest (or not at all) without a word
        _refuse_unmatched(view.unmatched(), params)
    why = applicability(r, view.shape, view.has)
    if why:
        mapped = [m.param for m in r.maps]
        raise GaugeAuditError(
            f"the rule cannot act on these parameters: {why} (rule maps {', '.join(mapped)}; "
            f"names gives {', '.join(view.specs) or 'nothing'})"
        )
    d = draw(r, view.shape, seed + 1, kappa)
    with torch.no_grad():
        changes = apply(r, view, d.elements)
        k = max(d.kappa, sandwich_kappa(r, view, d.elements))
        new = view.updated(changes)
    touched = sorted({view._key(n, c.layer) for n, c in changes})
    moved = [key for key in touched if not torch.equal(new[key], params[key])]
    if not moved:
        raise GaugeAuditError(
            f"the rule changed no parameter (it maps {', '.join(r.params)}); a check that moves "
            "nothing would pass vacuously"
        )
    p0 = {key: _cast(v, dtype) for key, v in params.items()}
    p1 = {key: _cast(v, dtype) for key, v in new.items()}
    x = _cast(inputs, dtype)
    with torch.no_grad():
        y0 = forward(p0, x).to(torch.float64)
        y1 = forward(p1, x).to(torch.float64)
    if not (torch.isfinite(y0).all() and torch.isfinite(y1).all()):
        raise GaugeAuditError("the forward pass produced NaN or infinite values")
    err = float((y1 - y0).abs().max() / y0.abs().max())
    K = path_length or _path_length(view, _seq_len(inputs))
    L = view.n_layers
    tol = worst_case_tolerance(k, L, K, dtype)
    _, factor = statistical_factor(L, K, y0.numel())
    tol_stat = k * factor * eps(dtype)
    e = eps(dtype)
    return GaugeCheck(
        verdict_for(err, tol_stat, tol),
        err,
        err / e,
        tol / e,
        tol_stat / e,
        k,
        L,
        K,
        str(dtype).replace("torch.", ""),
        moved,
    )


def assert_gauge_invariant(
    forward: Callable,
    params: Mapping[str, torch.Tensor],
    rule,
    *,
    inputs,
    names=None,
    dims=None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    kappa: float = 10.0,
    layers: int | None = None,
    path_length: int | None = None,
    strict: bool = False,
    rotary_planes=None,
) -> GaugeCheck:
    """Assert that ``rule`` leaves ``forward`` unchanged on ``inputs`` (see the module doc).

    Raises :class:`AssertionError` when the change exceeds the worst-case tolerance κ·L·K·ε (with
    ``strict``, the statistical one) and when the rule cannot act on ``params`` or moves none of
    them.  Between the two tolerances it passes with a warning (explainable by rounding only if
    the roundings conspire)."""
    try:
        res = gauge_residual(
            forward,
            params,
            rule,
            inputs=inputs,
            names=names,
            dims=dims,
            seed=seed,
            dtype=dtype,
            kappa=kappa,
            layers=layers,
            path_length=path_length,
            rotary_planes=rotary_planes,
        )
    except (GaugeAuditError, NotApplicable) as exc:
        raise AssertionError(f"gauge check could not run: {exc}") from None
    if res.verdict == FAILS or (strict and res.verdict != HOLDS):
        raise AssertionError(f"not gauge invariant: {res.message()}")
    if res.verdict == HOLDS_WORST_CASE_ONLY:
        warnings.warn(f"within the worst-case bound only: {res.message()}", stacklevel=2)
    return res


__all__ = ["GaugeCheck", "assert_gauge_invariant", "gauge_residual"]


# Five decoders of 2025–26 at small sizes, for tests and benchmarks of ``groups DIR`` on
# architectures the project has no family file for: transformers' class name → overrides of the
# class's default config made small (:func:`gauge_audit.models.derived.small_copy`).  Pass them to
# :func:`gauge_audit.models.derived.tiny_checkpoint` to write a generic checkpoint directory.
DECODER_EXAMPLES: dict[str, dict] = {
    "GptOssForCausalLM": {},  # sinks, biases, alternating sliding windows, YaRN, MoE with a router bias
    # output-gated attention and Gated DeltaNet layers; two rotary planes of a head of 8 (the
    # default quarter of 8 would leave one plane: a special size)
    "Qwen3_5ForCausalLM": {
        "head_dim": 8,
        "linear_conv_kernel_dim": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    },
    "Olmo3ForCausalLM": {},  # OLMo 2's norms with sliding-window layers
    "Llama4ForCausalLM": {"num_local_experts": 2},  # top-1 of two experts: each sees half the tokens
    "Glm4MoeForCausalLM": {"use_qk_norm": True},  # partial rotary, sigmoid router, shared experts
}
# A second, wider configuration of each: four query heads in two KV groups, other widths.
DECODER_WIDER = {
    "hidden_size": 16,  # OLMo 3 takes head_dim = hidden_size / heads: 4
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 5,
    "vocab_size": 37,  # well above d: the first block sees more distinct tokens than its inputs have dimensions
}
