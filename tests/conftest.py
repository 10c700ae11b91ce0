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
from gauge_audit.models import checkpoint as checkpoint_io  # noqa: E402
from gauge_audit.runtime import keep_freed_memory  # noqa: E402

if _THREADS is not None:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# The suite allocates and frees model-sized float64 tensors thousands of times (the real
# checkpoints' canonicalisations and checks); with glibc's defaults each one is page-faulted in
# afresh.  Keep freed memory for reuse, as `compare` and `audit` do (SmolLM2's canonical-form
# tests: 31 s of kernel time → 22 s, peak 4.08 → 4.22 GB).  And keep it so when a test opens a
# checkpoint: opening one lowers glibc's mmap threshold to 1 MiB (steady memory for streamed
# checks of large models, measured by benchmarks/bench_checkpoint.py, not here), after which every
# block-sized tensor is mapped and faulted in afresh again (the suite: 9:03 → 7:30 on 2 cores).
keep_freed_memory()
checkpoint_io.steady_memory = lambda: False


def _heap_only() -> None:
    """Serve every allocation from the heap, which is never trimmed (glibc's M_MMAP_MAX = 0): from
    32 MiB up, blocks are otherwise mapped afresh and unmapped on free, and each of the real
    checkpoints' vocabulary-sized float64 tensors (SmolLM2's untied embedding and head: 226 MB each)
    is page-faulted in anew for every operation on it.  Measured on two canonicalisations of
    SmolLM2's untied copy: kernel time 6.9 s → 2.1 s, wall 26.7 s → 20.8 s, peak 4.37 → 4.51 GB.
    For the test processes only: the commands keep their mapped large blocks, which return to the
    system when freed and so keep their peaks low (compare, canonicalize)."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-4, 0)  # M_MMAP_MAX
    except (OSError, AttributeError):  # not glibc
        pass


_heap_only()


# Tests that share an expensive session- or module-scoped result run on one worker, so it is
# built once per run, not once per worker.  The scheduler sees test ids only (it runs in the
# controlling process, which collects nothing), so the groups are named by file and test name.
# In the files of _FIXTURE_GROUPS only the tests whose names match use the shared fixture (the
# others, e.g. a CLI audit of a small claim file, are scheduled on their own).
_FIXTURE_GROUPS = {
    # catalog_report, and the audits compared with it (another seed; another thread count)
    "tests/test_audit.py": ("catalog-audit", re.compile(r"test_catalog_audit_|test_audit_another_seed_")),
    "tests/test_threads.py": ("catalog-audit", re.compile(r"test_report_json_byte_identical_")),
    "tests/test_proofs_md.py": ("catalog-audit", re.compile(r"test_proofs_md_is_up_to_date_and_agrees")),
    # rules_report (the catalog as rules, in catalog_report's context), compared with catalog_report
    "tests/test_rules_audit.py": ("catalog-audit", re.compile(r"(?!test_rule_claims_example_paper_verdicts)")),
}
_FILE_GROUPS = {
    "tests/test_precision.py": "precision",  # the error study (MiniLM) and the referee test
    "tests/test_rules_checkers.py": "rule-checkers",
    "tests/test_rules_fuzz_sizes.py": "rules-fuzz-sizes",  # the random rules at two sizes (one fixture)
    "tests/test_rules_nearest.py": "rules-nearest",  # the nearest-statement examples' audit (one fixture)
    "tests/test_family_nullity.py": "family-nullity",  # the count test reads every configuration's measurement
    "tests/test_family_gemma.py": "gemma3-270m",  # the real Gemma 3 270M, dequantized once (~2.2 GB float64)
    "tests/test_family_deepseek.py": "deepseek",  # its nullity measurements, shared by two tests
    "tests/test_merge.py": "merge",  # the tiny trained model pairs (one session fixture)
    "tests/test_derived_groups.py": "derived-groups",  # five decoders' measurements, shared by two tests
    "tests/test_derived_operations.py": "derived-operations",  # the decoders' checkpoints (one module fixture)
}
# fuzz_results: 300 random rules, every checker, in two halves (one fixture instance each, ids
# ending in [half0] / [half1]), so each half can go to its own worker
_FUZZ = re.compile(r"tests/test_rules_fuzz_budget\.py::.*\[(half\d+)\]$")
# the maximality tests that share one configuration's dense measurement (the `analyzed` fixture);
# measured_equals_explained's ids end in the size, -A or -B
_NULLITY = re.compile(
    r"tests/test_nullity\.py::test_maximality_(?:measured_equals_explained|matrix_free_agrees_with_dense|"
    r"small_vocab_first_block_families|matrix_free_agrees_on_small_vocab)\[(.+?)(?:-[AB])?\]$"
)


def xdist_group(nodeid: str) -> str | None:
    """The group of a test id, or None for a test that shares nothing expensive."""
    path, _, name = nodeid.partition("::")
    if "smollm2" in name:  # in the test's name or its parameters (smollm2, smollm2-untied)
        return "smollm2"  # the real SmolLM2 weights, dequantized once per process (~1 GB float64)
    if path == "tests/test_docs.py":  # the examples' shared run; the audit blocks read the catalog audit
        return "catalog-audit" if name.startswith("test_docs_catalog") else "docs"
    if path in _FILE_GROUPS:
        return _FILE_GROUPS[path]
    if path in _FIXTURE_GROUPS:
        group, users = _FIXTURE_GROUPS[path]
        return group if users.match(name) else None
    m = _FUZZ.match(nodeid)
    if m:
        return f"rules-fuzz-{m.group(1)}"
    m = _NULLITY.match(nodeid)
    return f"nullity-{m.group(1)}" if m else None


# Seconds of the units that dominate the run (measured per worker process in a full run, one torch
# thread each, on a busy 2-core machine: only their ratios matter).  The scheduler hands out the
# most expensive unit first, so the two workers each start on a heavy group and the short tests
# fill in behind them: longest first keeps the workers' totals within about one short test of each
# other.  A long test that shares nothing is a unit of its own and is listed too (by file and test
# function, every parametrisation alike): counted as a short one it would be handed out last and
# run alone at the end while the other worker idles (the thread-count audits and the terminal
# runs of test_progress.py did: 12 s of one idle worker).  A unit not listed counts DEFAULT_SECONDS
# per test.  Only the order depends on these numbers, never what runs.
GROUP_SECONDS = {
    "smollm2": 78.0,
    "catalog-audit": 90.0,
    "rules-nearest": 51.0,
    "rules-fuzz-sizes": 26.0,
    "rules-fuzz-half0": 42.0,
    "rules-fuzz-half1": 41.0,
    "family-nullity": 15.0,
    "derived-groups": 150.0,
    "derived-operations": 200.0,
    "precision": 9.5,
    "rule-checkers": 5.0,
    "gemma3-270m": 4.5,
    "deepseek": 4.0,
    "docs": 3.5,
    "merge": 2.5,
}
TEST_SECONDS = {
    "tests/test_checkpoint_gguf.py::test_packaged_gguf_dequantized_bit_for_bit_as_the_gguf_package_does": 2.5,
    "tests/test_gauge_fix.py::test_compare_minilm_real_weights": 8.0,
    "tests/test_audit_parallel.py::test_parallel_report_byte_identical_to_serial": 6.0,
    "tests/test_audit_fuzz.py::test_fuzz_formula_hypothesis": 5.0,
    "tests/test_progress.py::test_bar_on_a_terminal_only_and_never_with_json": 4.5,  # two terminal runs
    "tests/test_audit_fuzz.py::test_fuzz_rule_expression_hypothesis": 4.0,
    "tests/test_cli_small.py::test_a_subcommand_imports_its_own_module_only": 3.5,
    "tests/test_rules_budget.py::test_false_head_rule_settles_within_the_claim_budget_with_its_counterexample": 2.5,
    "tests/test_rules_audit.py::test_rule_claims_example_paper_verdicts": 2.5,
    "tests/test_audit_fuzz.py::test_fuzz_malformed_claim_files": 2.0,
}
DEFAULT_SECONDS = 0.3


def unit_seconds(scope: str, tests: int) -> float:
    """The expected seconds of one unit of work (a group, or a single test)."""
    if scope in GROUP_SECONDS:
        return GROUP_SECONDS[scope]
    return TEST_SECONDS.get(scope.partition("[")[0], DEFAULT_SECONDS * tests)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups above: each group is one unit of work, every other
    test its own; the most expensive unit left is handed out first (:func:`unit_seconds`).
    (xdist's own loadgroup reads ``xdist_group`` marks through a node-id suffix that this pytest
    no longer carries.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

        def _assign_work_unit(self, node) -> None:
            # move the most expensive unit to the front; the base class then takes the first
            heaviest = max(self.workqueue, key=lambda scope: unit_seconds(scope, len(self.workqueue[scope])))
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

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
def audit_context():
    """One audit context (seed 0) for the session's default audits (the catalog, the catalog as
    rules): the models, nullity measurements and reference outputs they have in common are built
    once.  Everything it caches is deterministic in the seed, so an audit's verdicts and numbers
    do not depend on what ran before it in the same context.  Its models are the ``model``
    fixture's (the same read-only objects)."""
    from gauge_audit.audit.checkers import Context

    class SharedModels(Context):
        def model(self, name: str):
            return _model(name, self.seed)

    return SharedModels(seed=0)


@pytest.fixture(scope="session")
def catalog_report(tmp_path_factory, audit_context):
    """The default audit of the built-in catalog (seed 0), run once per session,
    with its report files written to a temporary directory."""
    from gauge_audit.audit.run import audit
    from gauge_audit.claims import load_catalog
    from gauge_audit.report import write

    catalog = load_catalog()
    # in this process (its test worker's core): forked audit workers would compete with the other test
    # worker for the same two cores and repeat the small models' setup (3.6 CPU-s more).  The CLI's
    # parallel audit is compared with this serial one (tests/test_threads.py) and on its own
    # (tests/test_audit_parallel.py).
    report = audit(list(catalog.values()), audit_context, progress=None, jobs=1)
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
    "gpt2-untied": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(
            n_embd=16,
            n_layer=2,
            n_head=4,
            n_positions=24,
            vocab_size=40,
            tie_word_embeddings=False,
            activation_function="gelu",
            layer_norm_epsilon=1e-6,
        ),
    ),
    "gpt2-bare": ("GPT2Config", "GPT2Model", dict(n_embd=16, n_layer=2, n_head=4, n_positions=24, vocab_size=40)),
    "bert": (
        "BertConfig",
        "BertModel",
        dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=32,
            vocab_size=40,
            max_position_embeddings=24,
        ),
    ),
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
            vocab_size=40,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        ),
    ),
    "llama-bias-tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=6,
            intermediate_size=24,
            vocab_size=40,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=True,
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
            vocab_size=40,
            sliding_window=None,
        ),
    ),
    "qwen": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
            vocab_size=40,
        ),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=24,
            vocab_size=40,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    # Gemma: small soft-caps (scores and logits reach the tanh's curved part), a window shorter than
    # the inputs, a query_pre_attn_scalar ≠ d_head, two RoPE bases with linear scaling on the full layers
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=6,
            intermediate_size=24,
            vocab_size=40,
            sliding_window=5,
            query_pre_attn_scalar=10,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,
            intermediate_size=24,
            vocab_size=40,
            sliding_window=5,
            query_pre_attn_scalar=10,
            tie_word_embeddings=False,
            final_logit_softcapping=3.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                "full_attention": {"rope_type": "linear", "factor": 3.0, "rope_theta": 700.0},
            },
        ),
    ),
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


@pytest.fixture(scope="session")
def hf_family(tmp_path_factory):
    """``hf_family(kind)`` -> a directory holding the tiny random transformers model ``kind`` of
    tests/hf_families.py (written once per session with save_pretrained; treat as read-only)."""
    from hf_families import save

    made: dict = {}

    def get(kind):
        if kind not in made:
            made[kind] = tmp_path_factory.mktemp(kind)
            save(kind, made[kind])
        return made[kind]

    return get
