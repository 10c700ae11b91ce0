"""The theory: every continuous symmetry family, as infinitesimal generators in parameter space.

Each builder returns :class:`Family` objects: a name, a dimension formula (text and
value), the generators as rows of a (k × P) matrix in the flat layout of
:class:`~gauge_audit.nullity.measure.Layout`, and a derivation.  Generators are exact
tangent vectors dθ = d/dt θ(g(t))|₀ of one-parameter subgroups (written out
analytically from the group actions of :mod:`gauge_audit.actions`, extended where the
measurement found more), so J·v = 0 holds up to rounding for every exact family.

Conventions: row vectors (x·W), W_Q (h, d, e), W_O (h, e, d), FFN W_in (d, f),
W_out (f, d), a leading expert axis in MoE blocks (see :mod:`gauge_audit.models.layers`).

Families are built to be linearly independent of one another (where two actions share
directions, one of them is restricted to a complement), so the dimensions add up;
:mod:`.explain` checks that the ranks do.

Kinds:

* ``exact`` — a symmetry of the architecture at every parameter point of the stratum;
* ``eps-broken`` — exact only when the norms' ε is 0 (scale invariance of the norm);
  with ε > 0 its generators have ‖J·v‖ ≈ ε-sized but non-zero, and whether the
  measurement sees them as flat depends on ε against the float64 resolution;
* ``data`` — created by the sampled inputs, not the architecture (dead / always-active
  ReLU units, experts never routed).  Reported, never hidden.

Modules, by kind (imports point down this list):

* :mod:`.base` — :class:`Family`, the :class:`Rows` accumulator, index helpers;
* :mod:`.readers` — who reads and writes the residual stream;
* :mod:`.attention` — qk-gl, vo-gl, key-bias-shift, value-bias-fold;
* :mod:`.ffn` — relu-/swiglu-scaling, router-offset;
* :mod:`.first_block` — the small-vocabulary families (unreached-readers, bias-trade,
  input-offset, tied-unembed-null);
* :mod:`.stream` — norms and the residual stream of pre-norm models;
* :mod:`.post_norm` — post-norm (BERT) segments;
* :mod:`.output_norm` — normed sublayer outputs without pre-norms (OLMo 2);
* :mod:`.qk_norm` — what a QK-norm leaves of qk-gl (Qwen3, OLMo 2);
* :mod:`.gemma` — sandwich norms, QK-norm and their special points (Gemma 2/3);
* :mod:`.parallel` — the parallel residual's bias trade (GPT-NeoX);
* :mod:`.deepseek` — multi-head latent attention and the sigmoid-routed MoE (DeepSeek-V3);
* :mod:`.data` — directions created by the sample, not the architecture;
* :mod:`.token_tables` — block-0 sublayers that read only the vocab points (a parallel
  residual's FFN, OLMo 2's first attention): the null space of their finite table; tied, the
  rotation a parallel block 0's table lets W_E take (tied-table-rotation).

:func:`families` assembles them for one problem; :func:`theory` adds the sample's genericity.
"""

from __future__ import annotations

from ..measure import Genericity, Problem, genericity, progress
from .attention import key_bias_family, qk_family, value_bias_family, vo_family
from .base import AFFINE, LN, Family
from .data import data_families
from .deepseek import deepseek_families
from .ffn import ffn_scaling_family, router_family
from .first_block import first_block_families, tied_unembed_family
from .gemma import gemma_families
from .output_norm import output_norm_families
from .parallel import parallel_bias_family
from .post_norm import post_norm_families
from .qk_norm import qk_norm_input_family, qk_norm_scale_family
from .readers import pre_norm_readers, pre_norm_writers
from .stream import Segment, pre_norm_families, translation_family
from .token_tables import token_table_families


def families(problem: Problem, gen: Genericity) -> list[Family]:
    """Every family of the problem's architecture (empty families dropped)."""
    cfg = problem.cfg
    if cfg.latent_attention:  # MLA: its latents, shared RoPE key and routers (see .deepseek)
        return [f for f in deepseek_families(problem, gen) if f.k > 0]
    if cfg.normed_inputs and cfg.normed_outputs:  # sandwich norms: their stream, norms and QK (see .gemma)
        sandwich = gemma_families(problem) + [ffn_scaling_family(problem, gen)] + data_families(problem, gen)
        return [f for f in sandwich if f is not None and f.k > 0]
    # a QK-norm replaces qk-gl by the rescaling of its weights (and an ε-broken input scale)
    qk = (
        [qk_family(problem)]
        if cfg.qk_norm == "none"
        else [qk_norm_scale_family(problem), qk_norm_input_family(problem)]
    )
    out: list[Family | None] = [*qk, vo_family(problem), key_bias_family(problem), value_bias_family(problem)]
    if cfg.attention_only and cfg.n_layers > 1:
        segs = [
            Segment(
                [(f"blocks.{i}.attn.b_O", "bias")],
                [(f"blocks.{i + 1}.attn.W_{n}", f"blocks.{i + 1}.attn.b_{n}") for n in "QKV"],
                f"blocks.{i + 1}.attn.b_O",
                False,
                f"attn {i}→{i + 1}",
            )
            for i in range(cfg.n_layers - 1)
        ]
        out.append(translation_family(problem, segs))
    if not cfg.attention_only:
        out += [ffn_scaling_family(problem, gen), router_family(problem)]
        if cfg.pre_norm:
            out += pre_norm_families(problem) + first_block_families(problem) + [parallel_bias_family(problem)]
        elif cfg.normed_outputs:
            out += output_norm_families(problem)
        else:
            out += post_norm_families(problem)
    out += data_families(problem, gen)
    built = [f for f in out if f is not None and f.k > 0]
    return built + token_table_families(problem, built)


def theory(problem: Problem, quiet: bool) -> tuple[Genericity, list[Family]]:
    """The sample's genericity (reported) and every family of generators at this point."""
    gen = genericity(problem)
    for line in gen.lines():
        progress(f"non-generic sample: {line}", quiet)
    return gen, families(problem, gen)


__all__ = [
    "AFFINE",
    "LN",
    "Family",
    "Segment",
    "data_families",
    "families",
    "ffn_scaling_family",
    "first_block_families",
    "key_bias_family",
    "post_norm_families",
    "pre_norm_families",
    "pre_norm_readers",
    "pre_norm_writers",
    "qk_family",
    "router_family",
    "theory",
    "tied_unembed_family",
    "translation_family",
    "value_bias_family",
    "vo_family",
]
