"""transformers as the independent reference forward: its own model classes and forward code,
evaluated in float64 throughout, with one decoder layer in memory at a time.

Float64 throughout.  Even in a float64 model, transformers (5.x) computes four things of the
LLaMA family in float32: ``*RMSNorm`` casts its input to float32, ``*RotaryEmbedding`` builds
``inv_freq`` and the angles in float32, eager attention takes the softmax in float32, and
Mixtral's router takes its softmax in float32.  That limits the reference to ~1e-7 relative —
six orders above the float64 rounding the project's checks resolve.  :func:`float64_internals`
evaluates exactly those four steps with the same formulas in float64 (attention: transformers'
``sdpa`` path, which stays in the input dtype); everything else is transformers' code as shipped.
Scaled RoPE tables (linear, dynamic, yarn, llama3, longrope) are transformers' own initialisers run with
float32 read as float64.
Gemma adds three: its (1 + w) RMSNorms (float32 too), Gemma 3's per-layer-type RoPE tables
(inverse frequencies built in float32) and Gemma 2's attention, which has no sdpa path (soft-capped
scores) — an eager attention with the softmax in the input dtype is registered for it
(:func:`exact_attention`).
DeepSeek-V3 adds its router (sigmoid scores, bias correction, group-limited top-k, all in float32;
its weight and bias are even kept as float32 parameters in a float64 model — their stored float32
values are exact in float64), re-evaluated by :func:`_sigmoid_router64`; its latent RMSNorms and its
RoPE table (over qk_rope_head_dim) are the generic ones above.  DeepSeek-V2 adds its softmax router
(:func:`_softmax_router64`) and its complex RoPE: the table as complex numbers (float32 angles) and
the rotation as a complex product taken in float32 (``xq.float()``) inside the module function
``apply_rotary_emb``, which :func:`_complex_rotary` replaces by the same product in the input's dtype.
``tests/test_checkpoint.py`` compares both the patched and the as-shipped forward with the project's.

One layer at a time.  The model is built with its decoder layers on the ``meta`` device; a forward
pre-hook gives layer ``i`` real float64 storage and loads its tensors just before it runs, a forward
hook returns it to ``meta`` afterwards, so memory holds the embeddings, one layer and the
activations whatever the depth.  The top-level forward (embeddings, masks, RoPE, final norm, head)
is transformers' own.  A test shows this equals ``from_pretrained`` on every supported architecture.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .errors import GaugeAuditError
from .models.checkpoint import Arch, Checkpoint
from .models.checkpoint.writer import output_links
from .models.config import Config
from .runtime import require_transformers


def uninitialised(cls, config, **kw):
    """``cls._from_config(config, **kw)`` without the random initialisation (the weights are about
    to be loaded; initialising SmolLM2 in float64 takes seconds).  Buffers are still computed by the
    constructors; the head is re-tied, which the skipped ``init_weights`` would have done."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - other transformers versions
        no_init_weights = contextlib.nullcontext  # type: ignore[assignment]  # same call: () -> a context manager
    with no_init_weights():
        model = cls._from_config(config, **kw)
    model.tie_weights()
    return model


def hf_kwargs(cfg: Config) -> dict:
    """Model-construction options float64 needs: MoE experts evaluated by the eager loop
    (transformers' default grouped matmul kernel takes only 16/32-bit floats)."""
    return {"experts_implementation": "eager"} if cfg.experts else {}


def hf_config(hf: dict):
    """A transformers config object from a config.json dict."""
    T = require_transformers()
    kw = {k: v for k, v in hf.items() if k not in ("model_type", "transformers_version")}
    try:
        return T.AutoConfig.for_model(hf.get("model_type", ""), **kw)
    except (ValueError, TypeError) as exc:
        raise GaugeAuditError(f"transformers cannot build this config: {exc}") from None


# ----------------------------------------------------------------------------- float64 internals
def _rmsnorm64(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rope64(self, x, position_ids):
    cfg = self.config
    base = cfg.rope_parameters["rope_theta"]
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dim = int(head * cfg.rope_parameters.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim))
    return _angles64(self, x, position_ids, inv_freq, self.attention_scaling)


def _angles64(self, x, position_ids, inv_freq, scaling):
    freqs = position_ids[..., None].to(torch.float64) * inv_freq.to(torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


class _Float64Torch:
    """``torch`` as seen by transformers' RoPE initialisers, with float32 read as float64: their
    own formulas (linear, dynamic, yarn, llama3) evaluated in float64."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _rope64_scaled(self, x, position_ids):
    """A scaled RoPE table (transformers' ROPE_INIT_FUNCTIONS) in float64, at this input's length
    (dynamic and longrope tables depend on it, as in transformers' ``dynamic_rope_update``)."""
    return _angles64(self, x, position_ids, *_scaled_inv_freq64(self, x, position_ids))


def _scaled_inv_freq64(self, x, position_ids):
    from transformers import modeling_rope_utils as mru

    n = int(position_ids.max()) + 1
    mru.torch = _Float64Torch()  # type: ignore[assignment]  # a float64 stand-in for the module, on purpose
    try:
        inv_freq, scaling = mru.ROPE_INIT_FUNCTIONS[self.rope_type](self.config, x.device, seq_len=n)
    finally:
        mru.torch = torch
    if self.rope_type == "longrope":  # its exponent is taken with Tensor.float(): the same formula in float64
        rp = self.config.rope_parameters
        head = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        dim = int(head * rp.get("partial_rotary_factor", 1.0))
        ext = rp["long_factor"] if n > rp["original_max_position_embeddings"] else rp["short_factor"]
        inv_freq = 1.0 / (
            torch.tensor(ext, dtype=torch.float64)
            * rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        )
    return inv_freq, scaling


def _complex_rope64(self, x, position_ids):
    """DeepSeek-V2's RoPE table as complex numbers a·e^{i·p·θ}, with float64 angles."""
    if getattr(self, "rope_type", "default") == "default":
        base, dim = self.config.rope_parameters["rope_theta"], self.config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim))
        scaling = self.attention_scaling
    else:
        inv_freq, scaling = _scaled_inv_freq64(self, x, position_ids)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq.to(torch.float64)
    return torch.polar(torch.ones_like(freqs), freqs) * scaling


def _complex_rotary(xq, xk, freqs_cis):
    """transformers' DeepSeek-V2 ``apply_rotary_emb`` with the complex product in the input's dtype
    when it is float64 (the original casts to float32 first; other dtypes keep that)."""
    work = torch.float64 if xq.dtype == torch.float64 else torch.float32
    q = torch.view_as_complex(xq.to(work).contiguous().reshape(*xq.shape[:-1], -1, 2))
    k = torch.view_as_complex(xk.to(work).contiguous().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.unsqueeze(1).to(q.device)
    return torch.view_as_real(q * f).flatten(3).type_as(xq), torch.view_as_real(k * f).flatten(3).type_as(xk)


def _gemma_rmsnorm64(self, x):
    """Gemma's RMSNorm n(x)·(1 + w), which transformers evaluates in float32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def _gemma3_rope64(self, x, position_ids, layer_type):
    """Gemma 3's per-layer-type RoPE tables (base per type; linear scaling divides the frequencies),
    whose inverse frequencies transformers builds in float32."""
    rp = self.config.rope_parameters[layer_type]
    dim = self.config.head_dim
    inv_freq = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim))
    if rp.get("rope_type", "default") == "linear":
        inv_freq = inv_freq / rp["factor"]
    elif rp.get("rope_type", "default") != "default":  # pragma: no cover - refused when reading the config
        raise GaugeAuditError(f"no float64 RoPE for rope_type {rp['rope_type']}")
    freqs = position_ids[..., None].to(torch.float64) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _eager_attention64(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kw):
    """transformers' eager attention (with Gemma 2's soft-capping), the softmax in the input dtype
    instead of float32 — for the architectures without an sdpa path (soft-capping)."""
    groups = module.num_key_value_groups
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    w = query @ key.transpose(2, 3) * (module.head_dim**-0.5 if scaling is None else scaling)
    if softcap is not None:
        w = softcap * torch.tanh(w / softcap)
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.softmax(w, dim=-1)
    return (w @ value).transpose(1, 2).contiguous(), w


EAGER64 = "gauge_audit_eager64"


def exact_attention(arch: Arch) -> str:
    """The attention implementation that keeps every step in the model's dtype (soft-capped
    scores: transformers refuses sdpa)."""
    if not arch.soft_capped:
        return "sdpa"
    T = require_transformers()
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    T.AttentionInterface.register(EAGER64, _eager_attention64)
    AttentionMaskInterface.register(EAGER64, eager_mask)
    return EAGER64


def _router64(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(hidden_states, self.weight)
    top, index = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):  # Mixtral always; Qwen3-MoE as configured
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top, index


def _sigmoid_router64(self, hidden_states):
    """DeepSeek-V3's router (sigmoid scores, bias-corrected group-limited top-k), which transformers
    evaluates in float32, in the input's dtype — the same steps."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(x, self.weight.to(x.dtype))
    scores = logits.sigmoid()
    choice = scores + self.e_score_correction_bias.to(x.dtype)
    per = self.num_experts // self.num_group
    group_scores = choice.view(-1, self.num_group, per).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, self.num_group, per).reshape(-1, self.num_experts)
    choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    index = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, index)
    if self.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, weights * self.routed_scaling_factor, index


def _softmax_router64(self, hidden_states):
    """DeepSeek-V2's router (softmax scores, greedy or group-limited top-k), which transformers
    evaluates in float32, in the input's dtype — the same steps."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(x, self.weight.to(x.dtype))
    scores = logits.softmax(dim=-1)
    if self.topk_method == "group_limited_greedy":
        per = self.num_experts // self.num_group
        group_scores = scores.view(-1, self.num_group, per).max(dim=-1).values
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, self.num_group, per).reshape(-1, self.num_experts)
        scores = scores.masked_fill(~score_mask.bool(), 0.0)
    weights, index = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
    return logits, weights * self.routed_scaling_factor, index


def float64_internals(model: torch.nn.Module) -> int:
    """Evaluate transformers' float32 internals (RMSNorm, RoPE angles, MoE router) in the model's
    dtype; returns how many modules were re-routed.  Each such module gets a subclass whose
    ``forward`` is the float64 version (transformers' output-capturing wrappers expect a class
    method, not an instance attribute)."""
    n = 0
    for module in model.modules():
        cls = type(module)
        name = cls.__name__
        forward: Callable[..., Any]  # the float64 forward for this module class
        if name.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            forward = _rmsnorm64
        elif name in ("Gemma2RMSNorm", "Gemma3RMSNorm"):
            forward = _gemma_rmsnorm64
        elif name == "Gemma3RotaryEmbedding":
            forward = _gemma3_rope64
        elif name == "DeepseekV2RotaryEmbedding":
            forward = _complex_rope64
            from transformers.models.deepseek_v2 import modeling_deepseek_v2

            # the module function the attention calls, replaced on purpose (a float64 input gets a
            # float64 product; other dtypes the original's float32 one)
            modeling_deepseek_v2.apply_rotary_emb = _complex_rotary
        elif name.endswith("RotaryEmbedding") and getattr(module, "rope_type", "default") == "default":
            forward = _rope64
        elif name.endswith("RotaryEmbedding") and module.rope_type in _SCALED:
            forward = _rope64_scaled
        elif name.endswith("TopKRouter"):
            forward = _router64
        elif name == "DeepseekV3TopkRouter":
            forward = _sigmoid_router64
        elif name == "DeepseekV2TopkRouter":
            forward = _softmax_router64
        else:
            continue
        # one subclass per (class, float64 forward): a RoPE class has one per table type
        module.__class__ = _SUBCLASSES.setdefault((cls, forward), type(f"{name}Float64", (cls,), {"forward": forward}))
        n += 1
    return n


_SUBCLASSES: dict[tuple, type] = {}
_SCALED = ("linear", "dynamic", "yarn", "llama3", "longrope")


# ----------------------------------------------------------------------------- streamed model
BIG = 1 << 24  # a global matrix of ≥ 16 M entries (128 MiB in float64) is loaded only while its module runs


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules constructed inside register their parameters on the ``meta`` device (no storage),
    their buffers as usual — so transformers' constructors still compute e.g. the RoPE tables,
    while a vocabulary-sized embedding costs nothing until it is loaded."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]  # patched for the block, on purpose
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]  # restored


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _set(obj, path: str, value) -> None:
    head, _, last = path.rpartition(".")
    setattr(_get(obj, head) if head else obj, last, value)


def _module_state(arch: Arch, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer's file tensors → transformers' module names.  Identical except the MoE files
    (Mixtral's per-expert w1/w3/w2, Qwen3-MoE's per-expert gate/up/down_proj), whose experts
    become the fused ``experts.gate_up_proj = [gate | up]`` and ``experts.down_proj`` parameters
    (what transformers' own loader does)."""
    if arch.expert_files is None:
        return sd
    pre, gate, up, down = arch.expert_files
    out: dict = {}
    w: dict = {}
    for k, t in sd.items():
        if k.startswith(f"{pre}experts."):
            e, which = k[len(pre) :].split(".")[1:3]
            w.setdefault(which, {})[int(e)] = t
        elif k.startswith(f"{pre}gate."):
            out["mlp.gate." + k.rsplit(".", 1)[1]] = t
        else:
            out[k] = t
    if not w:  # a dense layer of a mixed stack (DeepSeek's first_k_dense_replace)
        return out
    n = len(w[gate])
    out["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([w[gate][e], w[up][e]]) for e in range(n)])
    out["mlp.experts.down_proj"] = torch.stack([w[down][e] for e in range(n)])
    return out


class Reference:
    """transformers' model for a checkpoint's architecture and config, float64, layers streamed."""

    def __init__(self, arch: Arch, hf: dict, cfg: Config, *, exact: bool = True):
        T = require_transformers()
        self.arch, self.cfg = arch, cfg
        full = hf_config(hf)
        small_dict = dict(hf)
        small_dict.pop("layer_types", None)
        small_dict["num_hidden_layers" if "num_hidden_layers" in hf else "n_layer"] = 0
        small = hf_config(small_dict)
        impl = exact_attention(arch) if exact else None
        cls = getattr(T, arch.name)
        kw = {"dtype": torch.float64, **({"attn_implementation": impl} if impl else {}), **hf_kwargs(cfg)}
        with torch.device("meta"):
            layered = cls._from_config(full, **kw)
        with parameters_on_meta():  # buffers (RoPE tables) real, weights loaded later
            self.model = uninitialised(cls, small, **kw)
        self.layers = _get(layered, arch.layers)
        _set(self.model, arch.layers, self.layers)
        self.model.eval()  # after the transplant: dropout off in the layers too
        self.model.config.num_hidden_layers = cfg.n_layers
        if hasattr(full, "layer_types"):
            self.model.config.layer_types = full.layer_types
        self.patched = float64_internals(self.model) if exact else 0
        self.layer_names = [
            [f for link in output_links(arch, cfg) for f in link.files if f.startswith(arch.layer_prefix.format(i=i))]
            for i in range(cfg.n_layers)
        ]
        self.global_names = [
            f
            for link in output_links(arch, cfg)
            for f in link.files
            if not any(f.startswith(arch.layer_prefix.format(i=i)) for i in range(cfg.n_layers))
        ]
        # The embedding and head matrices (a vocabulary × d each: 4.2 GB in float64 for an 8 B model)
        # are loaded by their modules' hooks like the layers, one at a time; the rest stays loaded.
        shapes = {k: v.shape for k, v in self.model.state_dict(keep_vars=True).items()}
        self.streamed = {f: f for f in self.global_names if f in shapes and math.prod(shapes[f]) >= BIG}
        head = self.model.get_output_embeddings() if cfg.unembed else None
        if head is not None and cfg.tied:
            embed = self.model.get_input_embeddings()
            names = {id(m): n for n, m in self.model.named_modules()}
            key = f"{names[id(head)]}.weight"
            source = f"{names[id(embed)]}.weight"
            self.streamed[key] = source  # the tie is a second name for W_E: loaded from its file tensor
        # Parameters outside the checked function that transformers still evaluates (BERT's pooler)
        # get zero storage; the loaded ones are assigned by _weights, the layers by their hooks.
        loaded = set(self.global_names) | set(self.streamed)
        for name, module in self.model.named_modules():
            if name == arch.layers or name.startswith(arch.layers + "."):
                continue
            for pname, w in list(module._parameters.items()):
                key = f"{name}.{pname}" if name else pname
                if w is not None and w.is_meta and key not in loaded:
                    module._parameters[pname] = torch.nn.Parameter(
                        torch.zeros(w.shape, dtype=w.dtype), requires_grad=False
                    )

    @contextlib.contextmanager
    def _weights(self, tensor: Callable[[str], torch.Tensor]) -> Iterator[None]:
        kept = {f: tensor(f).contiguous() for f in self.global_names if f not in self.streamed}  # assigned as is
        kept.update({f: torch.empty(self._meta(f).shape, dtype=torch.float64, device="meta") for f in self.streamed})
        missing, unexpected = self.model.load_state_dict(kept, strict=False, assign=True)
        layer_keys = self.arch.layers + "."
        # the layers load in the hooks; a tied head shares W_E; BERT's pooler is not part of the output
        missing = [
            k
            for k in missing
            if not k.startswith(layer_keys) and not self._tied(k) and not re.fullmatch(self.arch.passthrough, k)
        ]
        if missing or unexpected:
            raise GaugeAuditError(
                f"transformers' {self.arch.name} does not match the tensors "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )

        def load(i):
            def pre(module, args):
                prefix = self.arch.layer_prefix.format(i=i)
                sd = _module_state(self.arch, {f[len(prefix) :]: tensor(f) for f in self.layer_names[i]})
                module.to_empty(device="cpu")
                module.load_state_dict(sd, strict=True)

            return pre

        def unload(module, args, out):
            module.to("meta")  # returns None: a forward hook's return value would replace the output

        def load_matrix(key, source):
            module_name, _, pname = key.rpartition(".")
            module = _get(self.model, module_name)

            def pre(mod, args):
                mod._parameters[pname] = torch.nn.Parameter(tensor(source).contiguous(), requires_grad=False)

            def post(mod, args, out):
                w = mod._parameters[pname]
                mod._parameters[pname] = torch.nn.Parameter(
                    torch.empty(w.shape, dtype=w.dtype, device="meta"), requires_grad=False
                )

            return module, pre, post

        hooks = []
        for i, layer in enumerate(self.layers):
            hooks.append(layer.register_forward_pre_hook(load(i)))
            hooks.append(layer.register_forward_hook(unload))
        for key, source in self.streamed.items():
            module, pre, post = load_matrix(key, source)
            hooks.append(module.register_forward_pre_hook(pre))
            hooks.append(module.register_forward_hook(post))
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
            for layer in self.layers:
                layer.to("meta")
            for key in self.streamed:
                module_name, _, pname = key.rpartition(".")
                module = _get(self.model, module_name)
                w = module._parameters[pname]
                module._parameters[pname] = torch.nn.Parameter(
                    torch.empty(w.shape, dtype=w.dtype, device="meta"), requires_grad=False
                )

    def _meta(self, key: str) -> torch.Tensor:
        module_name, _, pname = key.rpartition(".")
        return _get(self.model, module_name)._parameters[pname]

    def _tied(self, key: str) -> bool:
        return key == "lm_head.weight" and self.cfg.tied

    def forward(self, tensor: Callable[[str], torch.Tensor], inputs: dict) -> torch.Tensor:
        """Logits (causal LMs) or the last hidden state (GPT2Model, BertModel), float64.
        ``tensor(name)`` gives a file tensor by its HF name."""
        tokens = inputs["tokens"]
        kw = {"input_ids": tokens, "attention_mask": torch.ones_like(tokens)}
        if "token_types" in inputs:
            kw["token_type_ids"] = inputs["token_types"]
        if self.cfg.unembed:
            kw["use_cache"] = False
        with torch.no_grad(), self._weights(tensor):
            out = self.model(**kw)
        y = out.logits if self.cfg.unembed else out.last_hidden_state
        return y.to(torch.float64)


def checkpoint_tensors(ckpt: Checkpoint, cfg: Config | None = None, params=None) -> Callable[[str], torch.Tensor]:
    """HF-named tensors of a checkpoint: the stored ones as they are (an HF input), or the project
    layout written back to HF names (a GGUF input, or ``params`` given)."""
    cfg = cfg or ckpt.cfg
    if params is None and ckpt.format == "safetensors":
        entries = ckpt.source.entries
        direct = all(f in entries for link in output_links(ckpt.arch, cfg) for f in link.files)
        if direct:
            return lambda name: ckpt.raw(name, torch.float64)
    params = ckpt.params() if params is None else params
    by_file = {f: link for link in output_links(ckpt.arch, cfg) for f in link.files}
    last: dict = {}

    def tensor(name: str) -> torch.Tensor:
        link = by_file[name]
        assert link.write is not None  # every link of an HF layout writes
        if last.get("link") is not link:
            last["link"], last["out"] = link, link.write(*[params[p] for p in link.params])
        return last["out"][link.files.index(name)]

    return tensor


def tokenizer(ckpt: Checkpoint):
    """The checkpoint's tokenizer: the HF tokenizer files, or the GGUF's own vocabulary."""
    return _tokenizer(str(ckpt.path), ckpt.format, str(ckpt.hf_config.get("model_type", "")))


def _gguf_tokenizer_class(T, model_type: str):
    """The tokenizer class ``AutoTokenizer`` chooses for a GGUF file of this model type, found
    from the model type we already read.  ``AutoTokenizer`` itself reads the file's metadata again
    to build a config only to look the class up (Gemma 3 270M: 25 s against 3.6 s when measured).
    A type not in its table (llama in transformers 5.25) gets the generic fast tokenizer,
    ``TokenizersBackend``, which is where AutoTokenizer's own lookup ends for it (SmolLM2: 1.5 s
    against 0.3 s); AutoTokenizer where transformers has no such class.  The saved files are
    AutoTokenizer's, byte for byte (tests/test_checkpoint_gguf.py)."""
    from transformers.models.auto import tokenization_auto as ta

    if model_type not in ta.TOKENIZER_MAPPING_NAMES:
        return getattr(T, "TokenizersBackend", None) or T.AutoTokenizer
    name = ta.TOKENIZER_MAPPING_NAMES[model_type]
    if isinstance(name, (tuple, list)):  # (slow, fast) in older tables
        name = name[-1] or name[0]
    return (ta.tokenizer_class_from_name(name) if name else None) or getattr(T, "TokenizersBackend", T.AutoTokenizer)


@functools.lru_cache(maxsize=4)  # converting a GGUF vocabulary takes seconds
def _tokenizer(path: str, fmt: str, model_type: str = ""):
    T = require_transformers()
    try:
        if fmt == "gguf":
            cls = _gguf_tokenizer_class(T, model_type)
            return cls.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name)
        return T.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GaugeAuditError(f"{path}: no usable tokenizer ({str(exc).splitlines()[0]})") from None
