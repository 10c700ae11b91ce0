"""An architecture the project has no family file for, derived from transformers' own modules.

For a checkpoint whose class has no hand-written description, the model is transformers' own
forward in float64 (:class:`HFModel`), and its description — what every tensor *is* — is read
off the module tree and one probing forward (:func:`describe`):

* the usual decoder names place the heads (``q_proj`` … ``o_proj``, or a fused ``qkv_proj``,
  ``Wqkv`` or ``query_key_value`` split by rows, ``q_norm``/``k_norm``, ``sinks``; any other
  projection of the attention's input is a stream reader) and the feed-forward
  (``gate_proj``/``up_proj``/``down_proj``, ``gate_up_proj``, ``w1``/``w3``/``w2``, ``experts``,
  ``router``/``gate``, ``shared_expert(s)``); the stream's ends are transformers' own ``get_input_embeddings()`` and
  ``get_output_embeddings()``; the config gives the head counts, ``head_dim``, the rotary
  fraction and NoPE layers;
* the probe settles what names cannot: each norm's kind (RMSNorm, ``1+w`` RMSNorm, LayerNorm,
  weightless) and what it reads (the stream before a mixer or an FFN, or a sublayer's output —
  OLMo's and Gemma's post-norms), the residual (serial, or parallel blocks whose mixer and FFN
  both read the block's input; added outside a sublayer or inside it, as MPT's FFN does), and
  which stream reader each norm feeds.

What cannot be placed is listed by name with the reason (:attr:`Description.unplaced`): a later
stage refuses or reports it, never guesses.

transformers 5.x evaluates some steps in float32 even in a float64 model (RMSNorm, RoPE angles,
eager softmax, routers).  :class:`Float64` runs every one of them in float64 without knowing
which they are: inside it a cast or a ``dtype=`` request for a 32- or 16-bit float is a float64
one, so a float64 model's forward is float64 end to end.
"""

from __future__ import annotations

import json
import math
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode

from ..errors import GaugeAuditError
from ..runtime import generator, require_transformers

_LOW = (torch.float32, torch.float16, torch.bfloat16)
# Measured on the checkpoint's own weights up to this size, else on a small copy: the measurement
# factors a P × P triangle a few times (one dense SVD at P = 20 000 is 2·10¹³ flops, minutes on two
# cores), so the limit is the dense limit of `nullity`.
MAX_PARAMS_OWN = 6_000
# and never on more: the Jacobian's blocks of P/2 rows are P²/2 numbers (1.6 GB at this size)
MAX_PARAMS_MEASURED = 20_000
OWN_WEIGHTS, SMALL_COPY = "the checkpoint's own weights", "a small copy at a generic point"  # HFModel.source
# the usual names of a decoder's parts (Llama's first; GPT-J's, Phi's and NeoX's after)
STACKS = ("layers", "h", "blocks")  # the list of decoder layers
EMBEDDINGS = ("embed_tokens", "wte", "embed_in", "word_embeddings")
OUTPUTS = ("o_proj", "out_proj", "dense")  # attention's stream writer
FFN_WRITERS = ("down_proj", "c_proj", "fc2", "fc_out", "dense_4h_to_h", "w2")
FFN_READERS = ("gate_proj", "up_proj", "gate_up_proj", "fc1", "c_fc", "fc_in", "dense_h_to_4h", "w1", "w3")


class Float64(TorchFunctionMode):
    """Casts to 32/16-bit floats (``.float()``, ``.to(torch.float32)``, ``dtype=torch.float32``)
    become float64 casts: transformers' float32 islands re-run in float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float or func is torch.Tensor.half or func is torch.Tensor.bfloat16:
            func = torch.Tensor.double
        if kwargs.get("dtype") in _LOW:
            kwargs["dtype"] = torch.float64
        if func is torch.Tensor.to or func is torch.Tensor.type:
            args = tuple(torch.float64 if a in _LOW else a for a in args)
        return func(*args, **kwargs)


class _Context:
    """What a custom autograd Function's forward may write to its context, taken and dropped."""

    def save_for_backward(self, *tensors) -> None:
        pass

    def mark_non_differentiable(self, *tensors) -> None:
        pass


@contextmanager
def plain_functions(module: torch.nn.Module):
    """The custom ``torch.autograd.Function`` classes of the module's own source files, called as
    their forward — so torch.func differentiates the forward's own operations (its derivative
    exact) instead of refusing a Function it cannot transform (BLOOM's GELU, whose hand-written
    backward is that same tanh-GELU's derivative).  Restored on exit."""
    sources = {sys.modules.get(type(m).__module__) for m in module.modules()}
    functions = {
        obj
        for src in sources
        if src is not None
        for obj in vars(src).values()
        if isinstance(obj, type)
        and issubclass(obj, torch.autograd.Function)
        and obj.__module__ == src.__name__
        and "setup_context" not in vars(obj)  # torch.func transforms those itself
    }
    saved = {f: vars(f).get("apply") for f in functions}
    for f in functions:
        f.apply = classmethod(lambda cls, *args: cls.forward(_Context(), *args))  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        for f, apply in saved.items():
            if apply is None:
                delattr(f, "apply")
            else:
                f.apply = apply  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- description
@dataclass(frozen=True)
class Norm:
    module: str
    weight: str | None  # parameter name; None: a weightless norm
    bias: str | None
    kind: str  # rms | rms1p (n(x)·(1 + w)) | layernorm | weightless | layernorm-weightless (centred)
    reads: (
        str  # stream-mixer | stream-ffn | stream (both, in a parallel block) | mixer-out | ffn-out | embed-out | heads
    )

    def gamma(self, params: dict) -> torch.Tensor | None:
        """The elementwise factor the normalised input is multiplied by."""
        if self.weight is None:
            return None
        w = params[self.weight]
        return 1.0 + w if self.kind == "rms1p" else w


@dataclass(frozen=True)
class Reader:
    """A tensor that reads the stream: the stream is axis ``axis`` of ``param``; ``norm`` is the
    norm whose output it reads (None: the raw stream)."""

    param: str
    axis: int
    norm: Norm | None
    bias: str | None = None


@dataclass(frozen=True)
class Writer:
    """A tensor whose output is added to the stream, the stream along ``axis`` (with its bias)."""

    param: str
    axis: int
    bias: str | None = None


@dataclass(frozen=True)
class Hidden:
    """One coordinate space between readers and writers (an FFN's units, an expert's): each entry
    (param, axis) has that space along ``axis``; ``experts`` > 0: axis 0 of every entry is the
    expert."""

    name: str
    readers: tuple[tuple[str, int], ...]
    writers: tuple[tuple[str, int], ...]
    experts: int = 0
    router: str | None = None  # the router's weight (E, d) and bias, when ``experts``
    router_bias: str | None = None
    per_expert: tuple[str, ...] = ()  # further tensors indexed by expert (the writer's bias, router buffers)
    layer: int = -1
    biases: tuple[tuple[str, str], ...] = ()  # (a reader's bias, the reader's weight): one unit's pre-activation


@dataclass(frozen=True)
class Heads:
    """Softmax attention: per head query/key/value rows of the projections (nn.Linear: rows are
    outputs), ``q_stride`` rows per query head (2·head_dim with an output gate: [query | gate]).
    Each head's rows are consecutive; where they start is the projection's layout: ``q_starts``
    per query head, ``k_starts`` / ``v_starts`` per KV group (separate projections; one fused
    [queries | keys | values], Phi-3's ``qkv_proj``; or fused per KV group, [its queries | its key |
    its value], the ``query_key_value`` of NeoX, Falcon and BLOOM)."""

    layer: int
    q: str
    k: str
    v: str
    o: str
    qb: str | None
    kb: str | None
    vb: str | None
    ob: str | None
    n_heads: int
    n_kv: int
    head_dim: int
    q_stride: int
    rotary: int  # rotated coordinates per head (0: NoPE), half-split planes (i, i + rotary/2)
    q_norm: Norm | None
    k_norm: Norm | None
    qk_norm: str  # none | head | full | weightless
    sinks: str | None
    q_starts: tuple[int, ...]
    k_starts: tuple[int, ...]
    v_starts: tuple[int, ...]

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv

    @property
    def gated(self) -> bool:
        return self.q_stride != self.head_dim


@dataclass(frozen=True)
class Latent:
    """A low-rank latent of multi-head latent attention: rows [start, start + rank) of ``down``
    (and of its bias) write it, an RMSNorm ``norm`` normalises it, the input columns of
    ``readers`` read it — a small stream of its own."""

    layer: int
    name: str  # query | key-value
    down: str
    down_bias: str | None
    start: int
    rank: int
    norm: Norm
    readers: tuple[str, ...]


@dataclass(frozen=True)
class LatentHeads:
    """Multi-head latent attention (DeepSeek V2/V3): per head the rows of ``q`` are [nope | rope]
    and those of ``kv_b`` [key nope | value]; the rotary key, ``rope`` rows of ``kv_a`` from
    ``rope_start`` (after the key-value latent's), is shared by every head; ``o``'s input columns
    come ``v`` per head."""

    layer: int
    q: str
    kv_a: str
    kv_b: str
    o: str
    n_heads: int
    nope: int
    rope: int
    v: int
    rope_start: int
    rope_bias: str | None = None  # the bias whose entries from ``rope_start`` the rotary key adds


@dataclass(frozen=True)
class Opaque:
    """A mixer other than softmax attention (linear attention, …): its stream readers' and writer's
    weights and the tensors inside it; only coordinatewise scalings are tried on it."""

    layer: int
    readers: tuple[str, ...]
    writer: str | None
    inner: tuple[str, ...]


@dataclass(frozen=True)
class SpecialSize:
    """A vocabulary where more directions may be flat than at a generic size."""

    what: str  # why, and from which vocabulary on the size is taken as generic
    safe: int  # that vocabulary


@dataclass
class Description:
    architecture: str
    d_model: int
    n_layers: int
    vocab: int
    embed: str
    head: str  # lm_head's weight (the embedding when tied)
    tied: bool
    final_norm: Norm | None
    readers: list[Reader] = field(default_factory=list)
    writers: list[Writer] = field(default_factory=list)
    post_norms: list[Norm] = field(default_factory=list)  # norms whose output is added to the stream
    post_writers: dict[str, list[Writer]] = field(default_factory=dict)  # post-norm → the writers it normalises
    heads: list[Heads] = field(default_factory=list)
    hidden: list[Hidden] = field(default_factory=list)
    mixers: list[str] = field(default_factory=list)  # per layer: the mixer's class
    opaque: list[Opaque] = field(default_factory=list)
    latents: list[Latent] = field(default_factory=list)
    latent_heads: list[LatentHeads] = field(default_factory=list)
    placed: set[str] = field(default_factory=set)
    unplaced: list[tuple[str, str]] = field(default_factory=list)  # (parameter, why)
    residual: str = "serial"  # serial, parallel, or why the stream structure was not recognised
    # the input tables summed into the stream's first value, the tokens' first (learned positions after)
    tables: list[str] = field(default_factory=list)
    # parameters read only by a discrete choice (a router's correction bias, as a parameter)
    selection: list[str] = field(default_factory=list)

    @property
    def stream_described(self) -> bool:
        """Every writer adds to one stream that every reader reads (in sequence or in parallel
        blocks alike: the stream's own candidates act on readers and writers, not on the order)."""
        return self.residual in ("serial", "parallel")

    def lines(self) -> list[str]:
        return [f"{p}: {why}" for p, why in self.unplaced]

    @property
    def latent_readers(self) -> list[Reader]:
        """The readers of the latents (each behind its latent's norm): not readers of the stream."""
        return [Reader(r, 1, lt.norm) for lt in self.latents for r in lt.readers]

    def special_vocabulary(self, params: dict) -> SpecialSize | None:
        """A vocabulary too small for the first block, which reads only the V token vectors.

        * In a parallel first block the FFN reads only n(W_E[t]): its output is a table of V·d
          numbers, V·(d − 1) of them seen where the readers centre (a LayerNorm is blind to the
          table's 1-component).  Where the FFN's n parameters outnumber those, directions that keep
          the table are flat beyond any group; the block's other per-token parameters raise the need
          (measured: Cohere's SwiGLU needs V·(d − 1) ≥ n − d_ff, Phi's GELU FFN with biases 1.5·n),
          so a vocabulary is taken as safe from V·(d − 1) ≥ 2n.
        * A latent of the first block (multi-head latent attention) reads one vector per token: a
          map A of the latent is flat where rms(y·A) = rms(y) on those V vectors, r(r + 1)/2
          conditions for rank r (DeepSeek V3 at rank 6: 25 flat at 11 tokens, the 15 rotations
          from 40 on), taken as safe from twice that.

        The size with the largest safe vocabulary, or None where V reaches every one."""
        found: list[SpecialSize] = []
        V, d = self.vocab, self.d_model
        if self.residual == "parallel":
            first = {p for h in self.hidden if h.layer == 0 for p, _ in (*h.readers, *h.writers)}
            first |= {h.router for h in self.hidden if h.layer == 0 and h.router}
            n = sum(params[p].numel() for p in first)
            found.append(
                SpecialSize(
                    f"the first block's FFN reads only the {V} token vectors (a parallel block): a table of {V}·{d} "
                    f"numbers set by {n} parameters, which may leave directions flat beyond any group; from "
                    f"{-(-2 * n // (d - 1))} tokens on (entries seen twice the parameters)",
                    -(-2 * n // (d - 1)),
                )
            )
        for lt in self.latents:
            if lt.layer == 0:
                k = lt.rank * (lt.rank + 1) // 2
                found.append(
                    SpecialSize(
                        f"the first block's {lt.name} latent reads only the {V} token vectors: a map of it is flat "
                        f"where it keeps their rms, {k} conditions at rank {lt.rank}; from {2 * k} tokens on "
                        f"(twice the conditions)",
                        2 * k,
                    )
                )
        worst = max(found, key=lambda x: x.safe, default=None)
        return worst if worst is not None and V < worst.safe else None


# ----------------------------------------------------------------------------- the model
class Forward(Protocol):
    """What the measurement of a group asks of a model: its float64 parameters (and stored
    buffers), its vocabulary and its logits at any parameters — transformers' forward
    (:class:`HFModel`) or a reference family's own (:class:`.described.FamilyModel`)."""

    name: str
    source: str
    params: dict[str, torch.Tensor]

    @property
    def state(self) -> dict[str, torch.Tensor]: ...

    @property
    def vocab(self) -> int: ...

    def logits(self, params: dict, ids: torch.Tensor) -> torch.Tensor: ...


@dataclass
class HFModel:
    """transformers' model of one architecture at one float64 parameter point."""

    name: str
    module: torch.nn.Module
    params: dict[str, torch.Tensor]
    config: Any  # transformers' PretrainedConfig
    source: str  # what the parameters are: the checkpoint's, or a generic small copy's
    # buffers the checkpoint stores (a router's correction bias): state, though no parameter
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """Parameters and stored buffers: what a re-parametrisation may have to move."""
        return {**self.params, **self.buffers}

    @property
    def size(self) -> int:
        return sum(v.numel() for v in self.params.values())

    def logits(self, params: dict, ids: torch.Tensor) -> torch.Tensor:
        from torch.func import functional_call

        with Float64(), plain_functions(self.module):
            return functional_call(self.module, params, (ids,), {"use_cache": False}).logits

    @property
    def vocab(self) -> int:
        return int(self.config.vocab_size)


def _first_line(exc: BaseException) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return lines[-1] if lines else type(exc).__name__


def _hf_class(name: str):
    T = require_transformers()
    cls = getattr(T, name, None)
    if cls is None or not hasattr(cls, "_from_config"):
        raise GaugeAuditError(f"transformers {T.__version__} has no model class {name}")
    return cls


def build_module(arch: str, config, seed: int = 0) -> torch.nn.Module:
    """transformers' model, float64, eager attention and experts; its initialisation drawn from
    ``seed`` (the global generator's state is restored afterwards)."""
    cls = _hf_class(arch)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            m = cls._from_config(config, attn_implementation="eager", experts_implementation="eager")
    except (ValueError, TypeError, AttributeError, RuntimeError, AssertionError) as exc:
        raise GaugeAuditError(f"transformers cannot build {arch} from this config: {exc}") from None
    return _float64_module(m)


def _float64_module(m: torch.nn.Module) -> torch.nn.Module:
    for mod in m.modules():
        # nn.Embedding's padding_idx only zeroes that row's gradient (the forward reads the row
        # like any other): a Jacobian through it would call the row flat
        if isinstance(mod, torch.nn.Embedding):
            mod.padding_idx = None
    return m.to(torch.float64).eval()


def generic_point(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Parameters away from the special points of a fresh initialisation (norm weights exactly 1,
    biases and sinks 0, routers so small that a few experts take every token): a vector plus
    0.2·max(rms, 0.25)·N(0, 1), a matrix plus N(0, 1/4m) with m its smaller trailing size, so
    every projection (a router's too) spreads its outputs by O(1)."""
    g = generator(seed)
    out = {}
    for name, param in module.named_parameters():
        p = param.detach().to(torch.float64)
        if p.dim() >= 2:
            scale = 0.5 / math.sqrt(min(p.shape[-2:]))
        else:
            scale = 0.2 * max(float(p.pow(2).mean().sqrt()) if p.numel() else 0.0, 0.25)
        out[name] = p + scale * torch.randn(p.shape, generator=g, dtype=torch.float64)
    return out


_SIZE_FIELDS = {  # a small copy of a config: these fields at these values (when the config has them)
    "hidden_size": 8,
    "rotary_dim": 2,
    "intermediate_size": 6,
    "ffn_hidden_size": 6,  # Falcon's
    "intermediate_size_mlp": 6,
    "moe_intermediate_size": 3,  # 2·3 ≠ 8: the stream axis of fused expert tensors stays unique
    "shared_expert_intermediate_size": 3,
    "num_attention_heads": 2,
    "head_dim": 4,
    "vocab_size": 11,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts": 4,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 4,
    "linear_value_head_dim": 4,
    "sliding_window": 3,
    "attention_chunk_size": 3,
    # multi-head latent attention (DeepSeek V2/V3, …): the latents' ranks and the per-head query/key
    # split — a rotary part of two planes (its rotary tables are built for head_dim = the rotary part)
    "kv_lora_rank": 6,
    "q_lora_rank": 6,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 2,
    "v_head_dim": 4,
}


def tiny_checkpoint(arch: str, out: Path, seed: int = 0, **overrides) -> Path:
    """A checkpoint directory of transformers' ``arch`` at its config class's defaults made small
    (:func:`small_copy`), with ``overrides``, at a generic point; written by ``save_pretrained``.
    Unless ``overrides`` name the vocabulary, it is widened where the small one is a special size
    (:meth:`Description.special_vocabulary`)."""
    cls = _hf_class(arch)
    config = small_copy(cls.config_class())
    for k, v in overrides.items():
        setattr(config, k, v)
    config.architectures = [arch]
    module = build_module(arch, config, seed)
    module.load_state_dict(generic_point(module, seed), strict=False)
    if "vocab_size" not in overrides:
        model = HFModel(arch, module, dict(module.named_parameters()), config, SMALL_COPY)
        table = describe(model, seed).special_vocabulary(model.params)
        if table is not None:
            return tiny_checkpoint(arch, out, seed, **overrides, vocab_size=table.safe)
    out = Path(out)
    pretrained: Any = module  # a transformers PreTrainedModel
    pretrained.save_pretrained(out)
    return out


_EXPERT_COUNTS = ("num_local_experts", "n_routed_experts", "num_experts")
PER_LAYER = ("layer_types", "no_rope_layers", "mlp_only_layers")  # lists a small copy cuts to its layers


def small_copy(config, vocab: int | None = None):
    """The same architecture at small sizes (d 8, two heads of 4 with one KV head when the
    original groups them, d_ff 6, four experts, vocabulary 11 or ``vocab``), one layer of each
    layer type.  A config class that refuses these values is named in one line."""
    try:
        return _small_copy(config, vocab)
    except GaugeAuditError:
        raise
    except Exception as exc:  # the config class's own validators (layer-type counts, token ids, …)
        raise GaugeAuditError(f"{type(config).__name__}: no small copy of this config: {_first_line(exc)}") from None


def _read_only(c, name: str) -> bool:
    """A config attribute its class computes from others (a property): not set on a small copy."""
    return isinstance(getattr(type(c), name, None), property)


def _small_copy(config, vocab: int | None):
    c = config.__class__.from_dict(config.to_dict())
    for k, v in {**_SIZE_FIELDS, **({"vocab_size": vocab} if vocab else {})}.items():
        if getattr(c, k, None) is not None and not _read_only(c, k):  # Falcon's head_dim: d / heads
            setattr(c, k, v)
    if hasattr(c, "n_inner"):  # GPT-J's FFN width: None means 4·d
        c.n_inner = _SIZE_FIELDS["intermediate_size"]
    if getattr(c, "num_key_value_heads", None) is not None:
        c.num_key_value_heads = 1 if config.num_key_value_heads < config.num_attention_heads else 2
        if getattr(c, "num_kv_heads", None) is not None:  # Falcon's own name for it
            c.num_kv_heads = c.num_key_value_heads
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):  # token ids past the small vocabulary
        ids = getattr(c, k, None)
        if (
            isinstance(ids, int)
            and ids >= c.vocab_size
            or isinstance(ids, list)
            and max(ids, default=0) >= c.vocab_size
        ):
            setattr(c, k, None)
    if getattr(c, "num_experts_per_tok", None):
        c.num_experts_per_tok = min(2, c.num_experts_per_tok)
    elif hasattr(c, "num_experts_per_tok") and any(getattr(c, k, None) for k in _EXPERT_COUNTS):
        c.num_experts_per_tok = 2  # left unset by the class's defaults (DeepSeek V2's): routing needs a count
    for k in ("n_group", "topk_group"):
        if getattr(c, k, None) is not None:
            setattr(c, k, 1)
    n = config.num_hidden_layers
    # per-layer lists: the named ones, and every list of one type name per layer (layer_types,
    # mlp_layer_types, …); a layer's type is its entry in each of the latter
    named = [k for k in PER_LAYER if isinstance(getattr(c, k, None), list)]
    typed = [
        k
        for k, v in vars(c).items()
        if isinstance(v, list) and len(v) == n and v and all(isinstance(x, str) for x in v)
    ]
    types = list(zip(*(getattr(c, k) for k in typed))) if typed else None
    keep = list(range(min(2, n)))
    if types:  # one layer of each type, in the original order
        firsts = sorted({t: i for i, t in reversed(list(enumerate(types)))}.values())
        keep = firsts if len(firsts) > 1 else keep
    for k in dict.fromkeys(named + typed):
        listed = getattr(c, k, None)
        if isinstance(listed, list) and len(listed) == n and not _read_only(c, k):  # Mamba's layer_types
            setattr(c, k, [listed[i] for i in keep])
    if getattr(c, "first_k_dense_replace", None):
        c.first_k_dense_replace = 1
    c.num_hidden_layers = len(keep)
    return c


# ----------------------------------------------------------------------------- reading a checkpoint
def needs_derivation(path: Path) -> bool:
    """A Hugging Face checkpoint directory whose one architecture has no family file."""
    from .checkpoint import ARCHS

    if not (path.is_dir() and (path / "config.json").is_file()):
        return False
    try:
        names = json.loads((path / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(names, list) and len(names) == 1 and names[0] not in ARCHS


def load(path: Path, seed: int = 0, vocab: int | None = None) -> HFModel:
    """The checkpoint's own float64 parameters when it has at most ``MAX_PARAMS_OWN``, otherwise a
    small copy of its config at a generic point (with a vocabulary of ``vocab`` tokens, if given).
    The config is checked against the weights' shapes before anything of the config's size is
    built."""
    from .checkpoint import HFDir, layers_held

    T = require_transformers()
    hf = json.loads((path / "config.json").read_text())
    arch = hf.get("architectures")
    if not isinstance(arch, list) or len(arch) != 1 or not isinstance(arch[0], str):
        raise GaugeAuditError(f"{path}: config.json must name exactly one architecture (architectures = {arch!r})")
    arch = arch[0]
    _hf_class(arch)
    kw = {k: v for k, v in hf.items() if k not in ("model_type", "transformers_version")}
    try:
        config = T.AutoConfig.for_model(hf.get("model_type", ""), **kw)
    except Exception as exc:  # transformers' own validators raise their own classes
        raise GaugeAuditError(f"{path}: transformers cannot read this config: {_first_line(exc)}") from None
    files = HFDir(path)
    n_file = max(layers_held(f"{stack}.{{i}}.", files.entries) for stack in STACKS)
    n_cfg = getattr(config, "num_hidden_layers", None)
    if not isinstance(n_cfg, int) or n_cfg != n_file:
        raise GaugeAuditError(f"{path}: config.json says {n_cfg} layers, the weights hold {n_file}")
    embed = [n for n in files.entries if n.endswith(".weight") and n.split(".")[-2] in EMBEDDINGS]
    if len(embed) != 1:
        names = " or ".join(f"{e}.weight" for e in EMBEDDINGS)
        raise GaugeAuditError(f"{path}: no single token embedding ({names}) among the weights ({len(embed)} found)")
    shape = tuple(files.entries[embed[0]][1])
    if shape != (config.vocab_size, config.hidden_size):
        raise GaugeAuditError(
            f"{path}: {embed[0]} is {shape}, the config says vocab_size × hidden_size = "
            f"{(config.vocab_size, config.hidden_size)}"
        )
    own = sum(math.prod(s) for _, s in files.entries.values()) <= MAX_PARAMS_OWN
    if not own:
        config = small_copy(config, vocab)
        module = build_module(arch, config, seed)
        return HFModel(arch, module, generic_point(module, seed), config, SMALL_COPY)
    # transformers' own loader: it maps the file's layout (per-expert tensors, …) onto the modules
    try:
        module, info = _hf_class(arch).from_pretrained(
            path,
            dtype=torch.float64,
            use_safetensors=True,
            attn_implementation="eager",
            experts_implementation="eager",
            output_loading_info=True,
        )
    except Exception as exc:  # transformers' loader raises many classes; each is one line here
        raise GaugeAuditError(f"{path}: transformers cannot load these weights: {_first_line(exc)}") from None
    for key, what in (
        ("missing_keys", "has no tensor for"),
        ("mismatched_keys", "has a tensor of another shape for"),
        ("unexpected_keys", "has a tensor that is no parameter of the model:"),
    ):
        bad = sorted(str(k) for k in info.get(key) or ())
        if bad:
            raise GaugeAuditError(
                f"{path}: the weights {what} {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
            )
    module = _float64_module(module)
    with torch.no_grad():  # modules transformers keeps in float32 (routers) read their stored values again
        for name, p in module.named_parameters():
            if name in files.entries and tuple(files.entries[name][1]) == tuple(p.shape):
                p.copy_(files.get(name, torch.float64))
        stored = {n: b for n, b in module.named_buffers() if n in files.entries}
        for name, b in stored.items():
            b.copy_(files.get(name, torch.float64))
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in stored.items()}
    return HFModel(arch, module, params, config, OWN_WEIGHTS, buffers)


# ----------------------------------------------------------------------------- probing
def _first_tensor(args, kwargs):
    if "hidden_states" in kwargs and isinstance(kwargs["hidden_states"], torch.Tensor):
        return kwargs["hidden_states"]
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a
    return None


def _out_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return getattr(out, "last_hidden_state", None)


def _copy(t):
    return t.clone() if isinstance(t, torch.Tensor) else t


def probe(model: HFModel, ids: torch.Tensor) -> dict[str, tuple]:
    """Every module's (input, output, call order) over one forward (first call of each)."""
    io: dict[str, tuple] = {}
    handles = []
    for name, mod in model.module.named_modules():

        def hook(m, args, kwargs, out, name=name):
            if name not in io:  # copies: a forward may add to a module's output in place (Falcon's mlp)
                x, y = _first_tensor(args, kwargs), _out_tensor(out)
                io[name] = (_copy(x), _copy(y), len(io))

        handles.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model.logits(model.params, ids)
    except Exception as exc:  # transformers' own forward refuses this config (e.g. an odd head size for RoPE)
        raise GaugeAuditError(f"{model.name}: transformers' forward fails on this config: {_first_line(exc)}") from None
    finally:
        for h in handles:
            h.remove()
    return io


def _same(a, b) -> bool:
    """Equal values (a token-flattened copy, as MoE blocks return, counts as the same tensor)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.numel() != b.numel():
        return False
    b = b.reshape(a.shape)
    return bool(torch.allclose(a, b, rtol=1e-12, atol=1e-12 * float(b.abs().max() or 1)))


def _norm_kind(mod, x, y, params, prefix) -> Norm | None:
    """What a norm module computes, settled by its probed input and output."""
    w = params.get(prefix + ".weight")
    b = params.get(prefix + ".bias")
    if x is None or y is None or x.shape[-1] != y.shape[-1]:
        return None
    eps = next((float(getattr(mod, k)) for k in ("variance_epsilon", "eps") if hasattr(mod, k)), None)
    xc = x - x.mean(-1, keepdim=True)
    if eps is None and w is None:  # ε written into the forward (OLMo's LayerNorm): read off the probe,
        # ‖x_c‖/‖y‖ = √(mean x_c² + ε) row by row; the comparisons below then confirm it or not
        ms = xc.pow(2).mean(-1)
        eps = max(0.0, float((xc.norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-300)).pow(2).sub(ms).median()))
    eps = 1e-6 if eps is None else eps
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    ln = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    cands = []
    if w is None:
        cands += [("weightless", rms), ("weightless", x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30))]
        cands += [("layernorm-weightless", ln)]  # OLMo's non-parametric LayerNorm: centred, no γ or β
    else:
        cands += [("rms", rms * w), ("rms1p", rms * (1 + w)), ("layernorm", ln * w + (b if b is not None else 0))]
    for kind, z in cands:
        if z.shape == y.shape and torch.allclose(z, y, rtol=1e-9, atol=1e-9):
            return Norm(
                prefix,
                prefix + ".weight" if w is not None else None,
                prefix + ".bias" if b is not None else None,
                kind,
                "",
            )
    return None


def _is_norm(mod) -> bool:
    return "norm" in type(mod).__name__.lower()


def _rotary(config, attn, head_dim: int, root: torch.nn.Module) -> int:
    if getattr(attn, "use_rope", True) in (0, False):
        return 0
    rotary_module = any("rotary" in type(m).__name__.lower() for m in root.modules())
    if not rotary_module and all(getattr(config, k, None) is None for k in ("rope_parameters", "rotary_dim")):
        return 0  # no rotary embedding at all: learned or ALiBi positions (BLOOM, MPT)
    if isinstance(getattr(config, "rotary_dim", None), int):  # GPT-J, CodeGen: the rotated width itself
        return min(int(config.rotary_dim), head_dim)
    rp = getattr(config, "rope_parameters", None) or {}
    if rp and all(isinstance(v, dict) for v in rp.values()):
        rp = next(iter(rp.values()))
    factor = rp.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    # transformers' table: one frequency per even index below int(head_dim·factor), each on a plane
    return 2 * math.ceil(int(head_dim * factor) / 2)


def _stack(m: torch.nn.Module, n_layers: int) -> tuple[str, torch.nn.Module, str] | None:
    """(the name of the module holding the decoder layers, that module, the layers' list name):
    a list of ``n_layers`` modules under one of the usual names, at the top or one level below."""
    for base_name, base in [("", m), *m.named_children()]:
        for stack in STACKS:
            layers = getattr(base, stack, None)
            if isinstance(layers, torch.nn.ModuleList) and len(layers) == n_layers:
                return base_name, base, stack
    return None


def describe(model: HFModel, seed: int = 0) -> Description:
    m, cfg, params = model.module, model.config, model.params
    found = _stack(m, int(cfg.num_hidden_layers))
    pretrained: Any = m  # a transformers PreTrainedModel: its own embeddings' accessors
    embed_mod, head_mod = pretrained.get_input_embeddings(), pretrained.get_output_embeddings()
    if found is None or embed_mod is None or head_mod is None:
        raise GaugeAuditError(
            f"{model.name}: not a decoder of the usual shape (a token embedding, a list of layers named "
            f"{' or '.join(STACKS)}, an output head)"
        )
    base_name, base, stack = found
    pre = f"{base_name}." if base_name else ""
    names = {id(mod): n for n, mod in m.named_modules()}
    ids = torch.randint(0, model.vocab, (2, 6), generator=generator(seed))
    io = probe(model, ids)
    d = int(cfg.hidden_size)
    embed = f"{names[id(embed_mod)]}.weight"
    head_name = names[id(head_mod)]
    head = f"{head_name}.weight" if f"{head_name}.weight" in params else embed
    head_bias = _opt(params, f"{head_name}.bias")
    desc = Description(model.name, d, int(cfg.num_hidden_layers), model.vocab, embed, head, head == embed, None)
    desc.writers.append(Writer(embed, 1))
    desc.tables.append(embed)
    desc.placed |= {embed, head, head_bias or ""}
    # the final norm: the one norm beside the layers that does not read the embedding (BLOOM's
    # embedding LayerNorm does: it normalises the embedding's output before the stream starts)
    finals = [(f"{pre}{n}", mod) for n, mod in base.named_children() if _is_norm(mod)]
    embedded = io.get(names[id(embed_mod)])
    for n, mod in [f for f in finals if embedded is not None and f[0] in io and _same(io[f[0]][0], embedded[1])]:
        finals.remove((n, mod))
        nk = _norm_kind(mod, io[n][0], io[n][1], params, n)
        if nk is None:
            desc.unplaced.append((n, "the embedding norm's kind was not recognised"))
            continue
        desc.post_norms.append(Norm(nk.module, nk.weight, nk.bias, nk.kind, "embed-out"))
        desc.post_writers[nk.module] = [Writer(embed, 1)]
        desc.placed |= {nk.weight or "", nk.bias or ""}
    fname = finals[0][0] if len(finals) == 1 else f"{pre}norm"
    fn = io.get(fname)
    if fn is not None and len(finals) == 1:
        desc.final_norm = _norm_kind(finals[0][1], fn[0], fn[1], params, fname)
    if desc.final_norm is None:
        desc.unplaced.append((fname, "the final norm's kind was not recognised"))
    else:
        desc.placed |= {desc.final_norm.weight or "", desc.final_norm.bias or ""}
    desc.readers.append(Reader(head, 1, desc.final_norm, head_bias))
    for i, layer in enumerate(getattr(base, stack)):
        _layer(desc, model, io, i, layer, f"{pre}{stack}.{i}")
    for h in [h for h in desc.heads if h.q == h.v]:  # a fused layout is read off a name: the forward checks it
        change = _value_map_change(model, h, ids, seed)
        if not change < LAYOUT_CHECK:
            read = "per KV group" if h.q.endswith("query_key_value.weight") else "[queries | keys | values]"
            why = f"q, k and v fused in rows of another layout (a value map of KV group 0 read {read} "
            _drop_heads(desc, h, why + f"changed the logits by {change:.1e})")
    for name in params:
        if name not in desc.placed and not any(name == p for p, _ in desc.unplaced):
            desc.unplaced.append((name, "no role derived from its module name"))
    return desc


# a fused projection's layout holds when a value map of KV group 0 read in it leaves the logits
# within this (relative): rounding moves them ~10⁻¹⁵, a map in the wrong rows ~1 (√ε halfway in log)
LAYOUT_CHECK = math.sqrt(torch.finfo(torch.float64).eps)


def value_map(e: int, seed: int) -> torch.Tensor:
    """The e × e map the layout check applies to KV group 0's values: I plus a seeded draw."""
    return torch.eye(e, dtype=torch.float64) + 0.3 * torch.randn(
        e, e, generator=generator(seed + 7), dtype=torch.float64
    )


def _value_map_change(model: HFModel, h: Heads, ids: torch.Tensor, seed: int) -> float:
    """The logits' relative change under v ↦ N·v on KV group 0's value rows (and bias) with the
    group's o_proj columns ↦ ·N⁻¹ — an exact symmetry of softmax attention where the rows are right."""
    e, p = h.head_dim, dict(model.params)
    N = value_map(e, seed)
    rows = slice(h.v_starts[0], h.v_starts[0] + e)
    for name in (h.v, h.vb):
        if name:
            t = p[name].detach().clone()
            t[rows] = N @ t[rows]
            p[name] = t
    o = p[h.o].detach().clone()
    for head in range(h.group):
        cols = slice(head * e, (head + 1) * e)
        o[:, cols] = o[:, cols] @ torch.linalg.inv(N)
    p[h.o] = o
    with torch.no_grad():
        y, y2 = model.logits(model.params, ids), model.logits(p, ids)
    return float((y2 - y).abs().max() / y.abs().max())


def _drop_heads(desc: Description, h: Heads, why: str) -> None:
    """``h`` not described after all: its tensors unplaced with ``why``."""
    desc.heads.remove(h)
    desc.readers = [r for r in desc.readers if r.param != h.q]
    desc.writers = [w for w in desc.writers if w.param != h.o]
    for name in dict.fromkeys(x for x in (h.q, h.qb, h.o, h.ob) if x):
        desc.placed.discard(name)
        desc.unplaced.append((name, why))


def _children(io, prefix, layer):
    """The layer's children in call order: (name, module, input, output)."""
    out = []
    for name, mod in layer.named_children():
        full = f"{prefix}.{name}"
        if full in io:
            x, y, order = io[full]
            out.append((order, name, mod, x, y))
    return [t[1:] for t in sorted(out, key=lambda t: t[0])]


def _layer(desc: Description, model: HFModel, io, i: int, layer, prefix: str) -> None:
    params = model.params
    x_in = io[prefix][0]
    x_out = io[prefix][1]
    # children that pass their input through (dropout at evaluation) are no sublayers
    kids = [k for k in _children(io, prefix, layer) if not _same(k[2], k[3])]
    subs = [(n, mod, x, y) for n, mod, x, y in kids if not _is_norm(mod)]
    norms = [(n, mod, x, y) for n, mod, x, y in kids if _is_norm(mod)]
    if len(subs) != 2:
        desc.residual = f"layer {i}: {len(subs)} sublayers ({', '.join(n for n, *_ in subs)}), not a mixer and an FFN"
        return
    (mix_name, mix, mix_x, mix_y), (ffn_name, ffn, ffn_x, ffn_y) = subs
    desc.mixers.append(type(mix).__name__)
    # a mixer that adds the residual itself (BLOOM's) returns the stream: a norm reading it is a pre-norm
    mix_adds = _adds_residual(io, f"{prefix}.{mix_name}", mix, x_in)
    placed_norms: dict[str, Norm] = {}
    for n, mod, x, y in norms:
        nk = _norm_kind(mod, x, y, params, f"{prefix}.{n}")
        if nk is None:
            desc.unplaced.append((f"{prefix}.{n}", "a norm whose kind was not recognised"))
            continue
        if (_same(x, mix_y) and not mix_adds) or _same(x, ffn_y):  # a post-norm: it reads a sublayer's output
            feeds = ["mixer-out" if _same(x, mix_y) else "ffn-out"]
        else:  # a pre-norm: the sublayer(s) its output feeds (a parallel block: one norm may feed both)
            feeds = [r for r, sx in (("stream-mixer", mix_x), ("stream-ffn", ffn_x)) if _same(y, sx)]
            feeds = feeds or ["stream-mixer" if _same(x, x_in) else "stream-ffn"]
        placed = Norm(nk.module, nk.weight, nk.bias, nk.kind, feeds[0] if len(feeds) == 1 else "stream")
        for reads in feeds:  # one norm feeding both sublayers is one norm (one factor to fold)
            placed_norms[reads] = placed
        desc.placed |= {nk.weight or "", nk.bias or ""}
    post_mix, post_ffn = placed_norms.get("mixer-out"), placed_norms.get("ffn-out")
    for p in (post_mix, post_ffn):
        if p is not None:
            desc.post_norms.append(p)
    # the serial residual: x_mid = x_in + (post-norm of) mixer out; x_out = x_mid + (post-norm of) FFN out;
    # the parallel one (GPT-J, NeoX, Cohere): x_out = x_in + mixer out + FFN out, both reading x_in
    w_mix = (io[post_mix.module][1] if post_mix else mix_y).reshape(x_in.shape)
    if post_mix is None and mix_adds:
        w_mix = w_mix - x_in
    x_mid = x_in + w_mix
    w_ffn = (io[post_ffn.module][1] if post_ffn else ffn_y).reshape(x_mid.shape)
    if post_ffn is None and _adds_residual(io, f"{prefix}.{ffn_name}", ffn, x_mid):
        w_ffn = w_ffn - x_mid
    pre_mix, pre_ffn = placed_norms.get("stream-mixer"), placed_norms.get("stream-ffn")
    # the stream the FFN reads (through its pre-norm, if any): x_mid in sequence, x_in in parallel
    ffn_reads, ffn_fed = (io[pre_ffn.module][0], io[pre_ffn.module][1]) if pre_ffn else (ffn_x, ffn_x)
    summed = _same(x_out, x_mid + w_ffn) and _same(ffn_x, ffn_fed)
    if summed and _same(ffn_reads, x_mid):
        layout = "serial"
    elif summed and _same(ffn_reads, x_in):
        layout = "parallel"
    else:
        desc.residual = (
            f"layer {i}: the output is neither x + {mix_name}(…) then + {ffn_name}(…) in sequence nor "
            f"x + {mix_name}(…) + {ffn_name}(…) in parallel"
        )
        return
    if i == 0 or desc.residual == layout:
        desc.residual = layout
    elif desc.stream_described:
        desc.residual = f"layer {i}: a {layout} block after {desc.residual} ones"
        return
    n0 = len(desc.writers)
    _mixer(desc, model, io, i, f"{prefix}.{mix_name}", mix, pre_mix)
    n1 = len(desc.writers)
    _ffn(desc, model, i, f"{prefix}.{ffn_name}", ffn, pre_ffn)
    for post, ws in ((post_mix, desc.writers[n0:n1]), (post_ffn, desc.writers[n1:])):
        if post is not None:
            desc.post_writers[post.module] = list(ws)


def _adds_residual(io, name: str, mod, stream: torch.Tensor) -> bool:
    """Does the sublayer add the residual itself (MPT's FFN, BLOOM's attention and MLP take it as an
    argument)?  Its output is then the stream plus what its writer (a child named as a stream
    writer) wrote."""
    kids = {n for n, _ in mod.named_children()}
    writer = next((n for n in OUTPUTS + FFN_WRITERS if n in kids), None)
    wrote = io.get(f"{name}.{writer}") if writer else None
    if wrote is None or not isinstance(wrote[1], torch.Tensor) or wrote[1].numel() != stream.numel():
        return False
    return _same(io[name][1], stream + wrote[1].reshape(stream.shape))


def _linear(mod, name) -> bool:
    return isinstance(mod, torch.nn.Linear) and getattr(mod, "weight", None) is not None


def head_starts(fused: str | None, n_heads: int, n_kv: int, e: int, q_stride: int) -> dict[str, tuple[int, ...]]:
    """Where each query head's rows and each KV group's key and value rows start (:class:`Heads`)."""
    G = n_heads // n_kv
    if fused == "query_key_value":  # per KV group: G query heads, its key, its value
        block = (G + 2) * e
        return {
            "q_starts": tuple((h // G) * block + (h % G) * e for h in range(n_heads)),
            "k_starts": tuple(g * block + G * e for g in range(n_kv)),
            "v_starts": tuple(g * block + (G + 1) * e for g in range(n_kv)),
        }
    k0, v0 = (n_heads * q_stride, n_heads * q_stride + n_kv * e) if fused else (0, 0)
    return {
        "q_starts": tuple(h * q_stride for h in range(n_heads)),
        "k_starts": tuple(k0 + g * e for g in range(n_kv)),
        "v_starts": tuple(v0 + g * e for g in range(n_kv)),
    }


def _mixer(desc: Description, model: HFModel, io, i: int, prefix: str, mix, norm: Norm | None) -> None:
    params, cfg = model.params, model.config
    kids = {n for n, _ in mix.named_children()}
    out = next((n for n in OUTPUTS if n in kids), None)  # the writer: o_proj, out_proj (GPT-J), dense (Phi)
    # one projection for q, k and v: [queries | keys | values] (Phi-3's qkv_proj), or per KV group
    # [its queries | its key | its value] (query_key_value: NeoX and BLOOM one head per group,
    # Falcon one group or several)
    fused = next((n for n in ("qkv_proj", "Wqkv", "query_key_value") if n in kids), None) if out is not None else None
    if ({"q_proj", "k_proj", "v_proj"} <= kids and out is not None) or fused:
        n_heads = int(cfg.num_attention_heads)
        n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
        e = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
        if fused:
            q_out, k_rows = n_heads * e, n_kv * e
            proj = {x: f"{prefix}.{fused}" for x in "qkv"}
            rows = getattr(mix, fused).weight.shape[0]
            if rows != q_out + 2 * k_rows or n_heads % n_kv:
                desc.unplaced.append((f"{prefix}.{fused}.weight", f"{rows} rows for {n_heads} + 2·{n_kv} heads of {e}"))
                return
        else:
            q_out, k_rows = mix.q_proj.weight.shape[0], mix.k_proj.weight.shape[0]
            proj = {x: f"{prefix}.{x}_proj" for x in "qkv"}
        if q_out not in (n_heads * e, 2 * n_heads * e) or k_rows != n_kv * e:
            desc.unplaced.append((f"{prefix}.q_proj.weight", f"{q_out} query rows for {n_heads} heads of {e}"))
            return
        qn, kn, kind = None, None, "none"
        for side in ("q", "k"):
            mod = getattr(mix, f"{side}_norm", None)
            probed = io.get(f"{prefix}.{side}_norm")
            if mod is None or probed is None:
                continue
            nk = _norm_kind(mod, probed[0], probed[1], params, f"{prefix}.{side}_norm")
            if nk is None:
                desc.unplaced.append((f"{prefix}.{side}_norm", "a QK-norm whose kind was not recognised"))
                return
            w = params.get(f"{prefix}.{side}_norm.weight")
            if side == "q":  # per head (weights shared by the heads) or over all query heads jointly
                kind = "weightless" if w is None else ("head" if w.numel() == e else "full")
            nrm = Norm(nk.module, nk.weight, nk.bias, nk.kind, "heads")
            if side == "q":
                qn = nrm
            else:
                kn = nrm
        if getattr(mix, "qk_norm", None) is not None:  # one weightless norm module for both (Llama 4)
            kind = "weightless"
        sinks = f"{prefix}.sinks" if f"{prefix}.sinks" in params else None
        h = Heads(
            layer=i,
            q=f"{proj['q']}.weight",
            k=f"{proj['k']}.weight",
            v=f"{proj['v']}.weight",
            o=f"{prefix}.{out}.weight",
            qb=_opt(params, f"{proj['q']}.bias"),
            kb=_opt(params, f"{proj['k']}.bias"),
            vb=_opt(params, f"{proj['v']}.bias"),
            ob=_opt(params, f"{prefix}.{out}.bias"),
            n_heads=n_heads,
            n_kv=n_kv,
            head_dim=e,
            q_stride=q_out // n_heads,
            rotary=_rotary(cfg, mix, e, model.module),
            q_norm=qn,
            k_norm=kn,
            qk_norm=kind,
            sinks=sinks,
            **head_starts(fused, n_heads, n_kv, e, q_out // n_heads),
        )
        desc.heads.append(h)
        biases = {h.v: h.vb, h.k: h.kb, h.q: h.qb}  # a fused projection: its one bias (the first key wins)
        for reads in dict.fromkeys((h.q, h.k, h.v)):  # a fused projection reads the stream once
            desc.readers.append(Reader(reads, 1, norm, biases[reads]))
        desc.writers.append(Writer(h.o, 0, h.ob))
        desc.placed |= {x for x in (h.q, h.k, h.v, h.o, h.qb, h.kb, h.vb, h.ob, h.sinks) if x}
        desc.placed |= {x.weight for x in (qn, kn) if x is not None and x.weight}
        # another projection of the attention's input (an output gate of its own, Lfm3's g_proj,
        # AFMoE's gate_proj): a stream reader, whatever it computes — the stream's candidates act on
        # it as on q, k and v; nothing else is assumed of its rows
        for n, mod in mix.named_children():
            wname = f"{prefix}.{n}.weight"
            seen = io.get(f"{prefix}.{n}")
            if wname in desc.placed or not _linear(mod, n) or seen is None or not _same(seen[0], io[prefix][0]):
                continue
            desc.readers.append(Reader(wname, 1, norm, _opt(params, f"{prefix}.{n}.bias")))
            desc.placed |= {wname, f"{prefix}.{n}.bias"}
        return
    if out is not None and {"kv_a_proj_with_mqa", "kv_b_proj"} <= kids:
        _latent_attention(desc, model, io, i, prefix, mix, norm, out)
        return
    # another mixer (linear attention, …): its stream readers and writer by the module tree
    lins = [(n, mod) for n, mod in mix.named_modules() if _linear(mod, n)]
    readers: list[str] = []
    writer: str | None = None
    for n, mod in lins:
        wname = f"{prefix}.{n}.weight"
        if n.split(".")[0] in OUTPUTS:
            desc.writers.append(Writer(wname, 0))
            writer = wname
        elif mod.in_features == desc.d_model:
            desc.readers.append(Reader(wname, 1, norm))
            readers.append(wname)
        else:
            continue
        desc.placed.add(wname)
    inner = tuple(n for n in params if n.startswith(prefix + ".") and n not in desc.placed)
    desc.opaque.append(Opaque(i, tuple(readers), writer, inner))
    desc.placed |= set(inner)


def _latent_attention(desc: Description, model: HFModel, io, i: int, prefix: str, mix, norm, out: str) -> None:
    """Multi-head latent attention: the query read from the stream directly (``q_proj``) or through
    a latent (``q_a_proj`` → ``q_a_layernorm`` → ``q_b_proj``); the keys' and values' latent and the
    shared rotary key from ``kv_a_proj_with_mqa`` ([latent | rotary key] rows), its norm
    ``kv_a_layernorm``, the per-head keys and values from ``kv_b_proj``."""
    params, cfg = model.params, model.config
    kids = {n for n, _ in mix.named_children()}
    H = int(cfg.num_attention_heads)
    nope, rope, v = int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim), int(cfg.v_head_dim)
    r_kv = int(cfg.kv_lora_rank)
    latent_q = "q_a_proj" in kids and "q_b_proj" in kids
    q = f"{prefix}.{'q_b_proj' if latent_q else 'q_proj'}.weight"
    kv_a, kv_b, o = (f"{prefix}.{n}.weight" for n in ("kv_a_proj_with_mqa", "kv_b_proj", out))
    want = {q: H * (nope + rope), kv_a: r_kv + rope, kv_b: H * (nope + v)}
    for name, rows in want.items():
        if name not in params or params[name].shape[0] != rows:
            got = tuple(params[name].shape) if name in params else "absent"
            desc.unplaced.append((name, f"{got} for {H} heads of nope {nope} + rope {rope}, values {v}, latent {r_kv}"))
            return
    latents: list[Latent] = []
    for name, down, nrm, rank, reader in (
        ("query", "q_a_proj", "q_a_layernorm", int(cfg.q_lora_rank or 0), q),
        ("key-value", "kv_a_proj_with_mqa", "kv_a_layernorm", r_kv, kv_b),
    ):
        if name == "query" and not latent_q:
            continue
        probed = io.get(f"{prefix}.{nrm}")
        nk = None if probed is None else _norm_kind(getattr(mix, nrm), probed[0], probed[1], params, f"{prefix}.{nrm}")
        if nk is None or nk.kind not in ("rms", "rms1p") or nk.weight is None:
            desc.unplaced.append((f"{prefix}.{nrm}", "a latent's norm that is not an RMSNorm with a weight"))
            return
        w = f"{prefix}.{down}.weight"
        latent_norm = Norm(nk.module, nk.weight, None, nk.kind, "latent")
        latents.append(Latent(i, name, w, _opt(params, f"{prefix}.{down}.bias"), 0, rank, latent_norm, (reader,)))
    for r in [f"{prefix}.q_a_proj" if latent_q else f"{prefix}.q_proj", f"{prefix}.kv_a_proj_with_mqa"]:
        desc.readers.append(Reader(f"{r}.weight", 1, norm, _opt(params, f"{r}.bias")))
        desc.placed |= {f"{r}.weight", f"{r}.bias"}
    desc.writers.append(Writer(o, 0, _opt(params, f"{prefix}.{out}.bias")))
    desc.latents += latents
    kv_a_bias = _opt(params, f"{prefix}.kv_a_proj_with_mqa.bias")
    desc.latent_heads.append(LatentHeads(i, q, kv_a, kv_b, o, H, nope, rope, v, r_kv, kv_a_bias))
    desc.placed |= {q, kv_b, o, f"{prefix}.{out}.bias"} | {lt.norm.weight or "" for lt in latents}


def _ffn(desc: Description, model: HFModel, i: int, prefix: str, ffn, norm: Norm | None) -> None:
    params, d = model.params, desc.d_model

    def dense(pre: str, mod, name: str) -> None:
        ch = dict(mod.named_children())
        down = next((n for n in FFN_WRITERS if n in ch), None)
        if down is None:
            return
        readers = [n for n in FFN_READERS if n in ch]
        rs: list[tuple[str, int]] = []
        bs: list[tuple[str, str]] = []
        for n in readers:
            desc.readers.append(Reader(f"{pre}.{n}.weight", 1, norm, _opt(params, f"{pre}.{n}.bias")))
            rs.append((f"{pre}.{n}.weight", 0))
            if f"{pre}.{n}.bias" in params:
                rs.append((f"{pre}.{n}.bias", 0))
                bs.append((f"{pre}.{n}.bias", f"{pre}.{n}.weight"))
        desc.writers.append(Writer(f"{pre}.{down}.weight", 0, _opt(params, f"{pre}.{down}.bias")))
        desc.hidden.append(Hidden(name, tuple(rs), ((f"{pre}.{down}.weight", 1),), layer=i, biases=tuple(bs)))
        desc.placed |= {p for p, _ in rs} | {f"{pre}.{down}.weight", f"{pre}.{down}.bias"}

    ch = dict(ffn.named_children())
    dense(prefix, ffn, f"layer {i} FFN")
    ex = ch.get("experts")
    if ex is not None:
        pe = {n: p for n, p in params.items() if n.startswith(prefix + ".experts.")}
        E = next(iter(pe.values())).shape[0] if pe else 0
        up = [n for n in pe if re.search(r"\.(gate_up_proj|up_proj|gate_proj)$", n)]
        down = [n for n in pe if n.endswith(".down_proj")]
        if not up or len(down) != 1 or any(pe[n].dim() != 3 for n in up + down):
            for n in pe:
                desc.unplaced.append((n, "experts stored as other than fused (E, ·, ·) tensors"))
        else:
            rs, ws, bs = [], [], []
            for n in up:
                ax = _stream_axis(pe[n], d, n, desc)
                if ax is None:
                    return
                desc.readers.append(Reader(n, ax, norm))
                rs.append((n, 3 - ax))
                b = n + "_bias"
                if b in params:
                    rs.append((b, 1))
                    bs.append((b, n))
                    desc.placed.add(b)
            ax = _stream_axis(pe[down[0]], d, down[0], desc)
            if ax is None:
                return
            desc.writers.append(Writer(down[0], ax, _opt(params, down[0] + "_bias")))
            desc.placed |= set(up) | {down[0], down[0] + "_bias"}
            ws.append((down[0], 3 - ax))
            router = next((r for r in ("router", "gate") if r in ch and f"{prefix}.{r}.weight" in params), None)
            rw = f"{prefix}.{router}.weight" if router else None
            rb = _opt(params, f"{prefix}.{router}.bias") if router else None
            if rw:
                desc.readers.append(Reader(rw, 1, norm, rb))
                desc.placed |= {rw, rb or ""}
            bias = _opt(params, down[0] + "_bias")
            # buffers of the router indexed by expert (GLM's correction bias, used in the choice only)
            extra = (
                tuple(
                    f"{prefix}.{router}.{n}" for n, b in ch[router].named_buffers() if b.dim() == 1 and b.numel() == E
                )
                if router
                else ()
            )
            per = ((bias,) if bias else ()) + extra
            desc.hidden.append(Hidden(f"layer {i} experts", tuple(rs), tuple(ws), E, rw, rb, per, i, tuple(bs)))
    for sname in ("shared_expert", "shared_experts"):
        if sname in ch:
            dense(f"{prefix}.{sname}", ch[sname], f"layer {i} shared expert")
    if "shared_expert_gate" in ch:
        w = f"{prefix}.shared_expert_gate.weight"
        desc.readers.append(Reader(w, 1, norm))
        desc.placed.add(w)


def _opt(params, name: str) -> str | None:
    return name if name in params else None


def _stream_axis(t: torch.Tensor, d: int, name: str, desc: Description) -> int | None:
    axes = [a for a in (1, 2) if t.shape[a] == d]
    if len(axes) != 1:
        desc.unplaced.append((name, f"shape {tuple(t.shape)}: the stream axis (size {d}) is not unique"))
        return None
    return axes[0]
