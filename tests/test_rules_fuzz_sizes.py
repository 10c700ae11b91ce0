"""Soundness at every size: random rules on the query/key and value/output maps, over the
architecture classes the symbolic checker decides at two sizes (RoPE with two and three rotary
planes, grouped-query attention with two groups of two heads, a QK-norm, LayerNorm and RMSNorm
blocks), each settled by the symbolic and the torch checker.  No symbolic HOLDS may meet a torch
FAILS on a reference model the claim applies to: a special size (one rotary plane, one head per
group, a group trivial at its size) deciding a claim would show up here.

The groups include the subgroups an architecture defines (the rotary commutant and its
intersections, O1, the diagonal and sign matrices), so a large share of the rules hold on some
classes and fail on others.  The symbolic searches run under a token budget (the decision on the
stated rule, at both sizes, is what is tested); ``GAUGE_AUDIT_FUZZ_SIZE_RULES=N`` runs N rules."""

from __future__ import annotations

import os
import random

import pytest

from gauge_audit.audit import rule_checks as rc
from gauge_audit.audit.checkers import Context
from gauge_audit.claims import Claim, Document
from gauge_audit.claims.rule import parse_rule

SEED = 20261207
N_RULES = int(os.environ.get("GAUGE_AUDIT_FUZZ_SIZE_RULES", 32))
SEARCH_SECONDS = 0.05
DOC = Document("fuzz-sizes", "random rules at two sizes", (), "tests/test_rules_fuzz_sizes.py", "fuzz.toml")

# the architecture classes: (params that select them, the tiny reference models they run on)
CLASSES = (
    ({"family": "llama"}, ("llama-tiny", "llama-tiny-interleaved", "llama-tiny-gqa")),
    ({"family": "gemma"}, ("gemma3-tiny", "gemma2-tiny")),
    ({"family": "attn"}, ("attn-tiny-rope", "attn-tiny")),
    ({"family": "gpt2"}, ("gpt2-tiny",)),
)
_QK_GROUPS = ("GL", "O", "SO", "SO1", "O1", "rotary-GL", "rotary-O", "rotary-SO", "rotary-diagonal")
_QK_GROUPS += ("diagonal-matrix", "signs", "permutation")
_VO_GROUPS = ("GL", "O", "SO1", "diagonal-matrix", "signs", "permutation")
_FACTORS = ("{s}", "transpose({s})", "inv({s})", "inv(transpose({s}))")


def random_rule(rng: random.Random) -> dict:
    """A group element on d_k acting on the query and key maps, or on d_v acting on the value and
    output maps, each side with a random factor from the templates."""
    if rng.random() < 0.7:
        group = rng.choice(_QK_GROUPS)
        fq = rng.choice(_FACTORS)
        # half the time the key's factor is the query's contragredient partner (M ↔ M⁻ᵀ), a symmetry
        # wherever M commutes with the rotary rotations and survives the QK-norm
        fk = _FACTORS[3 - _FACTORS.index(fq)] if rng.random() < 0.5 else rng.choice(_FACTORS)
        maps = {"W_Q": f"W_Q @ {fq.format(s='M')}", "W_K": f"W_K @ {fk.format(s='M')}"}
        return {"scope": "kv-group", "elements": {"M": f"{group}(d_k)"}, "maps": maps}
    group = rng.choice(_VO_GROUPS)
    fv = rng.choice(_FACTORS)
    # half the time the output's factor is the value's inverse (N ↔ N⁻¹), a symmetry for every N
    fo = _FACTORS[(_FACTORS.index(fv) + 2) % 4] if rng.random() < 0.5 else rng.choice(_FACTORS)
    maps = {"W_V": f"W_V @ {fv.format(s='N')}", "W_O": f"{fo.format(s='N')} @ W_O"}
    return {"scope": "kv-group", "elements": {"N": f"{group}(d_v)"}, "maps": maps}


def _claims(n: int) -> list[Claim]:
    rng = random.Random(SEED)
    out = []
    while len(out) < n:
        table = random_rule(rng)
        params, models = CLASSES[len(out) % len(CLASSES)]
        out.append(
            Claim(
                f"fuzz-size-{len(out)}",
                DOC,
                "fuzz",
                "random",
                f"rule {table['maps']}",
                "symmetry",
                ("symbolic", "torch"),
                params,
                models=models,
                rule=parse_rule(table),
                expected="holds",
            )
        )
    return out


@pytest.fixture(scope="module")
def settled():
    ctx = Context(seed=0)
    ctx.cache[rc.SECONDS_KEY] = SEARCH_SECONDS
    rows = []
    for claim in _claims(N_RULES):
        sym, tor = rc.run("symbolic", claim, ctx), rc.run("torch", claim, ctx)
        rows.append((claim, sym, tor, rc.derivation(claim, ctx)))
    return rows


def test_fuzz_sizes_symbolic_holds_never_meets_torch_fails(settled):
    for claim, sym, tor, _ in settled:
        if sym.outcome == "HOLDS":
            assert tor.outcome == "HOLDS", (claim.params, claim.rule.text(), sym.summary, tor.summary)


def test_fuzz_sizes_every_symbolic_decision_is_taken_at_two_generic_sizes(settled):
    """Every class the symbolic checker decided is generic: RoPE with at least two planes at the first
    size and one more at the second where the rule meets the queries and keys, GQA with two groups
    of two heads; both sizes recorded."""
    for claim, _, _, d in settled:
        if d is None:
            continue
        assert d.sizes and d.sizes_second, claim.rule.text()
        assert d.sizes_second["d_model"] > d.sizes["d_model"]
        rope = claim.params["family"] in ("llama", "gemma") or "attn-tiny-rope" in claim.models
        if rope and "W_Q" in claim.rule.params:  # the rule meets the rotated queries and keys
            assert d.sizes["d_k"] >= 4 and d.sizes_second["d_k"] > d.sizes["d_k"]
        for a in d.per_arch:
            if "gqa" in a["arch"]:
                heads = [it for it in a["interfaces"] if it["name"].startswith("attention scores")]
                assert not heads or len(heads) == 4, a


def test_fuzz_sizes_mixes_true_and_false_rules(settled, capsys):
    """Not a speed assertion: the rules must exercise both outcomes, or the test above tests little."""
    counts: dict = {}
    for _, sym, tor, _ in settled:
        counts[(sym.outcome, tor.outcome)] = counts.get((sym.outcome, tor.outcome), 0) + 1
    with capsys.disabled():
        print(f"\nfuzz at two sizes: {len(settled)} rules; (symbolic, torch): {dict(sorted(counts.items()))}")
    holds = counts.get(("HOLDS", "HOLDS"), 0)
    assert len(settled) // 8 <= holds <= len(settled) - len(settled) // 8, counts
