"""Paper names of the parameters, and where each lives in the project's layout.

Papers (and the transformation rules of claim files) name parameters per head, per layer and
per model in the row-vector convention y = x·W: ``W_Q`` is d_model×d_k for one head, ``b_O``
a 1×d_model row, ``norm1.w`` the first norm's weight γ.  The project stores them stacked:
``blocks.{l}.attn.W_Q`` is (n_heads, d_model, d_head), a KV tensor is indexed by its KV head,
the experts of a mixture stack their FFN tensors on a leading axis, and a tied unembedding is
``embed.W_E`` transposed.  :data:`PARAMS` is the catalogue; :func:`locate` maps one paper-named
instance onto a key and an index of the project's parameter dict (any family, any checkpoint in
this layout).

Levels (how many instances a name has): ``model`` (one), ``layer`` (one per block), ``kv`` (one
per KV head of a block) and ``head`` (one per query head).  Query head h reads KV head
h // group_size.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config

MODEL, LAYER, KV, HEAD = 0, 1, 2, 3
LEVEL_NAMES = ("model", "layer", "kv", "head")


@dataclass(frozen=True)
class ParamName:
    name: str
    shape: tuple  # (rows, cols) in dimension names; vectors are 1×n rows
    level: int  # MODEL / LAYER / KV / HEAD
    kind: str  # weight | bias | norm_w | norm_b  (what an absent tensor means)
    doc: str

    @property
    def ffn(self) -> bool:
        """Stacked per expert in a mixture-of-experts block."""
        return self.name in FFN_NAMES


_P = [
    ParamName("W_Q", ("d_model", "d_k"), HEAD, "weight", "query projection of one head"),
    ParamName("W_K", ("d_model", "d_k"), KV, "weight", "key projection of one KV head"),
    ParamName("W_V", ("d_model", "d_v"), KV, "weight", "value projection of one KV head"),
    ParamName("W_O", ("d_v", "d_model"), HEAD, "weight", "output projection rows of one head"),
    ParamName("b_Q", (1, "d_k"), HEAD, "bias", "query bias of one head"),
    ParamName("b_K", (1, "d_k"), KV, "bias", "key bias of one KV head"),
    ParamName("b_V", (1, "d_v"), KV, "bias", "value bias of one KV head"),
    ParamName("b_O", (1, "d_model"), LAYER, "bias", "attention output bias"),
    ParamName("W_in", ("d_model", "d_ff"), LAYER, "weight", "FFN input (SwiGLU: up) projection"),
    ParamName("b_in", (1, "d_ff"), LAYER, "bias", "FFN input bias"),
    ParamName("W_gate", ("d_model", "d_ff"), LAYER, "weight", "SwiGLU gate projection"),
    ParamName("W_out", ("d_ff", "d_model"), LAYER, "weight", "FFN output projection"),
    ParamName("b_out", (1, "d_model"), LAYER, "bias", "FFN output bias"),
    ParamName("W_router", ("d_model", "n_experts"), LAYER, "weight", "mixture-of-experts router"),
    ParamName("norm1.w", (1, "d_model"), LAYER, "norm_w", "weight γ of the norm before attention (post-LN: after)"),
    ParamName("norm1.b", (1, "d_model"), LAYER, "norm_b", "shift β of that norm"),
    ParamName("norm2.w", (1, "d_model"), LAYER, "norm_w", "weight γ of the norm before the FFN (post-LN: after)"),
    ParamName("norm2.b", (1, "d_model"), LAYER, "norm_b", "shift β of that norm"),
    ParamName("W_E", ("vocab", "d_model"), MODEL, "weight", "token embedding"),
    ParamName("W_pos", ("n_ctx", "d_model"), MODEL, "weight", "learned position embedding"),
    ParamName("W_U", ("d_model", "vocab"), MODEL, "weight", "unembedding (tied: W_Eᵀ)"),
    ParamName("b_U", (1, "vocab"), MODEL, "bias", "unembedding bias"),
    ParamName("norm_f.w", (1, "d_model"), MODEL, "norm_w", "weight γ of the final norm"),
    ParamName("norm_f.b", (1, "d_model"), MODEL, "norm_b", "shift β of the final norm"),
]
PARAMS: dict[str, ParamName] = {p.name: p for p in _P}
FFN_NAMES = ("W_in", "b_in", "W_gate", "W_out", "b_out")
_ATTN = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
_NORM = {"norm1": "ln1", "norm2": "ln2"}
_MODEL_KEYS = {
    "W_E": "embed.W_E",
    "W_pos": "embed.W_pos",
    "W_U": "unembed.W_U",
    "b_U": "unembed.b_U",
    "norm_f.w": "ln_final.w",
    "norm_f.b": "ln_final.b",
}


def dims(cfg: Config) -> dict[str, int]:
    """The value of every dimension name for this configuration."""
    return {
        "d_model": cfg.d_model,
        "d_k": cfg.d_head,
        "d_v": cfg.d_head,
        "d_ff": cfg.d_ff,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "vocab": cfg.vocab,
        "n_ctx": cfg.n_ctx,
        "n_experts": cfg.experts,
    }


@dataclass(frozen=True)
class Location:
    key: str  # key of the project's parameter dict
    index: tuple  # leading indices (head, KV head or expert)
    transposed: bool = False  # the tied unembedding: W_U = embed.W_Eᵀ


def locate(
    cfg: Config,
    name: str,
    layer: int | None = None,
    kv: int | None = None,
    head: int | None = None,
    expert: int | None = None,
) -> Location:
    """Where one instance of a paper-named parameter lives (whether or not the model has it)."""
    p = PARAMS[name]
    if p.level == MODEL:
        if name == "W_U" and cfg.tied:
            return Location("embed.W_E", (), True)
        return Location(_MODEL_KEYS[name], ())
    blk = f"blocks.{layer}"
    if name in _ATTN:
        index = (head,) if p.level == HEAD else (kv,) if p.level == KV else ()
        return Location(f"{blk}.attn.{name}", index)
    if name.startswith("norm"):
        norm, part = name.split(".")
        return Location(f"{blk}.{_NORM[norm]}.{part}", ())
    if name == "W_router":
        return Location(f"{blk}.moe.W_router", ())
    if cfg.experts:
        return Location(f"{blk}.moe.{name}", (expert,))
    return Location(f"{blk}.mlp.{name}", ())


def present(cfg: Config, name: str, keys) -> bool:
    """Does the model (its parameter ``keys``) have this tensor?  A tied W_U counts (it is W_Eᵀ)."""
    layer = 0 if PARAMS[name].level != MODEL else None
    if PARAMS[name].level != MODEL and cfg.n_layers < 1:  # pragma: no cover - configs have layers
        return False
    return locate(cfg, name, layer, 0, 0, 0).key in keys


__all__ = [
    "FFN_NAMES",
    "HEAD",
    "KV",
    "LAYER",
    "LEVEL_NAMES",
    "Location",
    "MODEL",
    "PARAMS",
    "ParamName",
    "dims",
    "locate",
    "present",
]
