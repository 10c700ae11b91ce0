"""The corrected closed-form count (gauge_audit.symbolic.counts) equals the measured
Jacobian nullity on every pre-norm / attention configuration: the symbolic and the
nullity layers describe the same symmetry group.  (Post-LN encoders and MoE have
families — stream translations, segment scales, router offsets — that only the
nullity theory counts; the closed form does not claim them.)"""

from __future__ import annotations

import pytest

from gauge_audit.audit.nullity_checks import configs
from gauge_audit.models import gpt2, llama
from gauge_audit.nullity import analyze
from gauge_audit.symbolic import counts

SMALL = dict(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, d_ff=6, n_ctx=5, vocab=8, n_layers=1)
CASES = {
    **{k: v for k, v in configs().items() if k not in ("bert", "moe")},
    "gpt2-tied": gpt2.config(**SMALL, tied=True),
    "gpt2-nobias": gpt2.config(**SMALL, attn_bias=False, out_bias=False, mlp_bias=False),
    "gpt2-2layers": gpt2.config(**{**SMALL, "n_layers": 2}),
    "llama-noweight": llama.config(**{**SMALL, "n_kv_heads": 1}, norm="rmsnorm-noweight"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_count_nierop_corrected_count_equals_measured_nullity(name):
    cfg = CASES[name]
    measured = analyze(cfg, seed=0)
    assert measured.unexplained == 0
    b = counts.corrected_count(counts.ArchConfig.from_model(cfg))
    print(name, measured.measured_nullity, b.as_dict())
    assert b.established == measured.measured_nullity
