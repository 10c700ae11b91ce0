"""Shared fixtures: models are built once per session (building is deterministic).

The suite runs on pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml); a session
fixture is built once per worker, and the tests that share an expensive one are kept on one
worker (``xdist_group`` below)."""

from __future__ import annotations

import functools
import os
import re


def _worker_threads() -> int | None:
    """torch threads for one xdist worker: the cores shared out among the workers, at least one.
    Two workers of two threads each on two cores spend most of their CPU time spinning in each
    other's way (measured on the MiniLM checks: 4.5x the CPU time of one thread each)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers <= 0:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers)


_THREADS = _worker_threads()
if _THREADS is not None:
    # before torch is imported, so the OpenMP pool (and subprocesses, which inherit the
    # environment) start at this size; an explicit OMP_NUM_THREADS is left alone
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402

from gauge_audit.models import build  # noqa: E402

if _THREADS is not None:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Tests that share an expensive session- or module-scoped result run on one worker, so it is
# built once per run, not once per worker.  The scheduler sees test ids only (it runs in the
# controlling process, which collects nothing), so the groups are named by file and test name.
_FILE_GROUPS = {
    "tests/test_audit.py": "catalog-audit",        # catalog_report: the default audit of the catalog
    "tests/test_proofs_md.py": "catalog-audit",
    "tests/test_rules_audit.py": "catalog-audit",  # rules_report, compared with catalog_report
    "tests/test_precision.py": "precision",        # the error study (MiniLM) and the referee test
    "tests/test_rules_checkers.py": "rule-checkers",
    "tests/test_rules_fuzz_budget.py": "rules-fuzz",   # fuzz_results: 300 random rules, every checker
}
# the maximality tests that share one configuration's dense measurement (the `analyzed` fixture);
# measured_equals_explained's ids end in the size, -A or -B
_NULLITY = re.compile(r"tests/test_nullity\.py::test_maximality_(?:measured_equals_explained|matrix_free_agrees_with_dense|"
                      r"small_vocab_first_block_families|matrix_free_agrees_on_small_vocab)\[(.+?)(?:-[AB])?\]$")


def xdist_group(nodeid: str) -> str | None:
    """The group of a test id, or None for a test that shares nothing expensive."""
    path, _, name = nodeid.partition("::")
    if "smollm2" in name:   # in the test's name or its parameters (smollm2, smollm2-untied)
        return "smollm2"       # the real SmolLM2 weights, dequantized once per process (~1 GB float64)
    if path in _FILE_GROUPS:
        return _FILE_GROUPS[path]
    m = _NULLITY.match(nodeid)
    return f"nullity-{m.group(1)}" if m else None


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups above: each group is one unit of work, every other
    test its own; units with more tests are handed out first.  (xdist's own loadgroup reads
    ``xdist_group`` marks through a node-id suffix that this pytest no longer carries.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return GroupScheduling(config, log)


@functools.cache
def _model(name: str, seed: int = 0):
    return build(name, seed=seed, device="cpu")


@pytest.fixture(scope="session")
def model():
    """``model(name, seed=0)`` -> a cached float64 CPU model (treat as read-only)."""
    return _model


@pytest.fixture(scope="session")
def analyzed():
    """``analyzed(cfg, **kw)`` -> ``nullity.analyze(cfg, **kw)``, computed once per session for
    each configuration and arguments (the measurement is deterministic; treat it as read-only).
    Several maximality tests assert different things about the same dense measurement."""
    from gauge_audit.nullity import analyze

    made = {}

    def get(cfg, **kw):
        key = (repr(cfg), repr(sorted(kw.items())))
        if key not in made:
            made[key] = analyze(cfg, **kw)
        return made[key]
    return get


@pytest.fixture(scope="session")
def catalog_report(tmp_path_factory):
    """The default audit of the built-in catalog (seed 0), run once per session,
    with its report files written to a temporary directory."""
    from gauge_audit.audit.checkers import Context
    from gauge_audit.audit.run import audit
    from gauge_audit.claims import load_catalog
    from gauge_audit.report import write

    catalog = load_catalog()
    report = audit(list(catalog.values()), Context(seed=0), progress=None)
    out = tmp_path_factory.mktemp("report")
    write(report, out)
    return report, out


# ----------------------------------------------------------------------------- tiny HF checkpoints
# Small random models of every supported architecture, built offline from transformers configs and
# written with save_pretrained, so the checkpoint tests go through the real file format.  Every
# parameter is drawn from a seed (norm weights away from 1, non-zero biases: a mapping that drops or
# misplaces one of them must show).
HF_TINY = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=16, n_layer=2, n_head=4, n_positions=24, vocab_size=40)),
    "gpt2-untied": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=16, n_layer=2, n_head=4, n_positions=24,
                                                          vocab_size=40, tie_word_embeddings=False,
                                                          activation_function="gelu", layer_norm_epsilon=1e-6)),
    "gpt2-bare": ("GPT2Config", "GPT2Model", dict(n_embd=16, n_layer=2, n_head=4, n_positions=24, vocab_size=40)),
    "bert": ("BertConfig", "BertModel", dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=32, vocab_size=40, max_position_embeddings=24)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, intermediate_size=32, vocab_size=40,
                                                      rms_norm_eps=1e-5,
                                                      rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "llama-bias-tied": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=16, num_hidden_layers=2,
                                                                num_attention_heads=4, num_key_value_heads=1,
                                                                head_dim=6, intermediate_size=24, vocab_size=40,
                                                                attention_bias=True, mlp_bias=True,
                                                                tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                                            num_key_value_heads=2, intermediate_size=32, vocab_size=40,
                                                            sliding_window=None)),
    "qwen": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=32, vocab_size=40)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(hidden_size=16, num_hidden_layers=2,
                                                            num_attention_heads=4, num_key_value_heads=2,
                                                            intermediate_size=24, vocab_size=40, num_local_experts=4,
                                                            num_experts_per_tok=2)),
}


def randomize(model, seed: int = 0) -> None:
    """Generic weights: matrices N(0, 1/fan), norm weights in [0.6, 1.4], biases N(0, 0.1²)."""
    import math

    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name.lower() or ".ln_" in name or "ln_f" in name):
                p.copy_(0.6 + 0.8 * torch.rand(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed" in name or name.endswith(("wte.weight", "wpe.weight")):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(min(p.shape[-1], p.shape[-2])))


def build_hf(kind: str, seed: int = 0):
    transformers = pytest.importorskip("transformers")
    conf, arch, kw = HF_TINY[kind]
    model = getattr(transformers, arch)(getattr(transformers, conf)(**kw)).eval()
    randomize(model, seed)
    return model


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """``tiny_hf(kind, dtype=None, shard=False)`` -> a saved HF checkpoint directory (cached)."""
    made = {}

    def get(kind: str, dtype=None, shard: bool = False):
        key = (kind, str(dtype), shard)
        if key not in made:
            model = build_hf(kind)
            # save_pretrained draws a "Writing model shards" bar on stderr: tests that read
            # stderr (one-line errors) must see only what gauge-audit printed.
            import transformers
            transformers.utils.logging.disable_progress_bar()
            if dtype is not None:
                model = model.to(dtype)
            out = tmp_path_factory.mktemp(f"hf-{kind}")
            model.save_pretrained(str(out), **({"max_shard_size": "8KB"} if shard else {}))
            made[key] = out
        return made[key]
    return get


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say which shuffled order ran (pytest-randomly's header line is hidden by -q), so any
    order-dependent failure can be repeated with --randomly-seed=N."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None and not isinstance(seed, str):
        terminalreporter.write_line(f"test order shuffled by pytest-randomly: repeat it with --randomly-seed={seed}")
