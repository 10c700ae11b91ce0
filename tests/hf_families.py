"""Tiny Hugging Face models of the newer architectures (scaled RoPE, sliding window, QK-norm),
built offline from transformers configs with generic weights (conftest.randomize: norm weights
in [0.6, 1.4], non-zero biases), and the float64 comparison the family tests share."""

from __future__ import annotations

import pytest
import torch

from conftest import randomize
from gauge_audit.models.checkpoint import open_checkpoint
from gauge_audit.models.registry import FAMILIES, Model
from gauge_audit.numeric import tolerance

EPS64, EPS32 = torch.finfo(torch.float64).eps, torch.finfo(torch.float32).eps
_LLAMA = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=32,
    vocab_size=40,
    rms_norm_eps=1e-5,
    max_position_embeddings=8,
)
_QWEN3 = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=32,
    vocab_size=40,
    head_dim=6,
    rms_norm_eps=1e-5,
)
_MOE = dict(moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2)
# The inputs have 12 positions: beyond max_position_embeddings 8 (dynamic NTK rescales the base)
# and beyond original_max_position_embeddings 6 (longrope switches to the long factors).
KINDS = {
    "llama-linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(_LLAMA, rope_parameters={"rope_type": "linear", "factor": 2.5, "rope_theta": 500.0}),
    ),
    "llama-dynamic": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(_LLAMA, rope_parameters={"rope_type": "dynamic", "factor": 3.0, "rope_theta": 500.0}),
    ),
    "llama-yarn": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            _LLAMA,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 2.0,
                "rope_theta": 500.0,
                "original_max_position_embeddings": 4,
            },
        ),
    ),
    # original context 16: plane 0 (wavelength 2π) is medium (smoothed), plane 1 (≈140) low (divided)
    "llama-llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            _LLAMA,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 500.0,
            },
        ),
    ),
    "llama-longrope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            _LLAMA,
            rope_parameters={
                "rope_type": "longrope",
                "short_factor": [1.0, 1.3],
                "long_factor": [1.5, 2.5],
                "original_max_position_embeddings": 6,
                "rope_theta": 500.0,
            },
        ),
    ),
    "mistral-window": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(_LLAMA, max_position_embeddings=32, sliding_window=5),
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _QWEN3),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_QWEN3, **_MOE, norm_topk_prob=True)),
    "qwen3-moe-unnormed": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_QWEN3, **_MOE, norm_topk_prob=False)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {k: v for k, v in _QWEN3.items() if k != "head_dim"}),
    "olmo2-bias-yarn": (
        "Olmo2Config",
        "Olmo2ForCausalLM",
        dict(
            _LLAMA,
            attention_bias=True,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 2.0,
                "rope_theta": 500.0,
                "original_max_position_embeddings": 4,
            },
        ),
    ),
    "phi3-partial": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            _LLAMA,
            max_position_embeddings=32,
            partial_rotary_factor=0.5,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "phi3-longrope-window": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            _LLAMA,
            original_max_position_embeddings=6,
            sliding_window=5,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            rope_parameters={
                "rope_type": "longrope",
                "short_factor": [1.0],
                "long_factor": [2.0],
                "rope_theta": 500.0,
                "partial_rotary_factor": 0.5,
            },
        ),
    ),
    "neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=24,
            vocab_size=40,
            max_position_embeddings=32,
        ),
    ),
    "neox-sequential-linear": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=24,
            vocab_size=40,
            max_position_embeddings=32,
            use_parallel_residual=False,
            hidden_act="gelu_new",
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, "partial_rotary_factor": 0.5},
        ),
    ),
}


# DeepSeek-V3: a query latent (r_Q 6), key/value latent (r_KV 5), odd nope/value widths, one dense
# layer then MoE (4 experts in 2 groups, one group kept, top-2, a shared expert); variants without
# the query latent, with attention biases and rotate_half RoPE, and with yarn's mscale.
_DEEPSEEK = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=32,
    moe_intermediate_size=8,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=1,
    q_lora_rank=6,
    kv_lora_rank=5,
    qk_nope_head_dim=3,
    qk_rope_head_dim=2,
    v_head_dim=3,
    vocab_size=40,
    max_position_embeddings=32,
    routed_scaling_factor=2.5,
)
KINDS.update(
    {
        "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK),
        "deepseek-v3-noqlora-bias": (
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            dict(
                _DEEPSEEK,
                q_lora_rank=None,
                attention_bias=True,
                rope_interleave=False,
                norm_topk_prob=False,
                n_group=1,
                topk_group=1,
                qk_rope_head_dim=4,
            ),
        ),
        # DeepSeek-V2: softmax router; V2-Lite's layout (no query latent, greedy routing) and the
        # group-limited routing with a query latent
        "deepseek-v2-lite": (
            "DeepseekV2Config",
            "DeepseekV2ForCausalLM",
            dict(
                {k: v for k, v in _DEEPSEEK.items() if k not in ("n_group", "topk_group")},
                q_lora_rank=None,
                topk_method="greedy",
                qk_rope_head_dim=4,
            ),
        ),
        "deepseek-v2-grouped": (
            "DeepseekV2Config",
            "DeepseekV2ForCausalLM",
            dict(_DEEPSEEK, topk_method="group_limited_greedy", attention_bias=True),
        ),
        "deepseek-v3-yarn": (
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            dict(
                _DEEPSEEK,
                rope_parameters={
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "rope_theta": 500.0,
                    "original_max_position_embeddings": 4,
                    "mscale": 1.0,
                    "mscale_all_dim": 0.8,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                },
            ),
        ),
    }
)


def save(kind: str, out) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    conf, arch, kw = KINDS[kind]
    model = getattr(transformers, arch)(getattr(transformers, conf)(**kw)).eval()
    randomize(model, 0)
    with torch.no_grad():  # DeepSeek's router bias is a buffer, which randomize leaves at 0
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=torch.Generator().manual_seed(1)))
    model.save_pretrained(str(out))


def inputs(cfg, seed: int = 0, batch: int = 2, n: int = 12) -> dict:
    return {"tokens": torch.randint(0, cfg.vocab, (batch, n), generator=torch.Generator().manual_seed(seed))}


def hf_logits(path, ckpt, x, exact: bool) -> torch.Tensor:
    """transformers' own model from the files, float64 (exact: its float32 internals in float64)."""
    import transformers

    from gauge_audit.reference import float64_internals, hf_kwargs

    cls = getattr(transformers, ckpt.arch.auto)
    m = cls.from_pretrained(str(path), dtype=torch.float64, attn_implementation="sdpa", **hf_kwargs(ckpt.cfg)).eval()
    if exact:
        assert float64_internals(m) > 0
    with torch.no_grad():
        return m(input_ids=x["tokens"], attention_mask=torch.ones_like(x["tokens"])).logits.to(torch.float64)


def tol(cfg, n: int, kappa: float = 1.0, dtype=torch.float64) -> float:
    """κ·L·K·ε of the project's tolerance model for this configuration."""
    return tolerance(Model("x", cfg, {}, FAMILIES[cfg.family]), kappa, dtype, n)[0]


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def compare(path) -> tuple[float, float, float, float]:
    """(project vs transformers with float64 internals, its tolerance, vs as shipped, its float32 tolerance)."""
    ckpt = open_checkpoint(path)
    model = ckpt.model()
    x = inputs(ckpt.cfg)
    ours = model.forward(model.params, x)
    n = x["tokens"].shape[1]
    return (
        rel(ours, hf_logits(path, ckpt, x, True)),
        tol(ckpt.cfg, n),
        rel(ours, hf_logits(path, ckpt, x, False)),
        tol(ckpt.cfg, n, dtype=torch.float32),
    )


def transform_round_trip(src, out, action: str, capsys) -> None:
    """``gauge-audit transform`` on the directory ``src``: its certificate says HOLDS, and transformers'
    float64 logits of the written copy agree with the source's within the float32 tolerance of the
    element's κ (the files are float32)."""
    import json

    from gauge_audit.cli import main

    args = ["transform", "--checkpoint", str(src), "--action", action, "--out", str(out), "--seed", "1", "--json"]
    assert main(args) == 0
    cert = json.loads(capsys.readouterr().out)
    assert cert["verdict"] == "HOLDS"
    ckpt = open_checkpoint(src)
    x = {k: torch.tensor(v) for k, v in cert["inputs"].items()}
    err = rel(hf_logits(out, ckpt, x, True), hf_logits(src, ckpt, x, True))
    assert err <= tol(ckpt.cfg, x["tokens"].shape[1], cert["kappa"], torch.float32)
