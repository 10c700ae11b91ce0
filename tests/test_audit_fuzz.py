"""Fuzz the claim-file loader, the restricted formula parser and the rule-expression parser.

10 000 malformed claim files (seeded mutations of the real catalog), 10 000 formula strings
(hypothesis + seeded mutations) and 12 000 transformation-rule inputs (expressions by seeded
mutation and hypothesis, and mutated claim files with [claim.rule] tables): every input either
loads or raises GaugeAuditError — zero other exceptions — and nothing is ever evaluated as code:
payloads that would import a canary module under eval/exec/sympify never fire, and
eval/exec/compile are never called while parsing.
"""

from __future__ import annotations

import builtins
import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gauge_audit.claims import CATALOG_DIR, load_text
from gauge_audit.claims.expr import parse_formula
from gauge_audit.claims.matexpr import parse_expression
from gauge_audit.claims.rule import Element, symbols_for
from gauge_audit.errors import GaugeAuditError

N_FILES = 10_000
N_FORMULAS_MUTATED = 6_000
N_FORMULAS_HYPOTHESIS = 4_000


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A module whose import leaves a marker file, and spies on eval/exec/compile of text."""
    parse_formula("h*(d_k^2+d_v^2) + log(h!) + sqrt(2) + binomial(3, 2) + min(h, 2)")  # warm lazy imports
    marker = tmp_path / "CANARY_FIRED"
    (tmp_path / "ga_canary_mod.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[str] = []
    for name in ("eval", "exec", "compile"):
        original = getattr(builtins, name)

        def spy(*args, _name=name, _orig=original, **kw):
            # importlib executes compiled module code (lazy SymPy imports): that is not text evaluation
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if isinstance(args[0] if args else None, (str, bytes)) and not caller.startswith("importlib"):
                calls.append(_name)
            return _orig(*args, **kw)

        monkeypatch.setattr(builtins, name, spy)
    yield calls
    assert not marker.exists(), "a claim-file payload was executed"
    assert "ga_canary_mod" not in sys.modules


PAYLOADS = [
    "__import__('ga_canary_mod')",
    '__import__("ga_canary_mod").x',
    "eval(\"__import__('ga_canary_mod')\")",
    "exec('import ga_canary_mod')",
    "lambda: __import__('ga_canary_mod')",
    "(lambda x: x)(1)",
    "os.system('true')",
    "().__class__.__bases__[0].__subclasses__()",
    "Symbol('x')",
    "import ga_canary_mod",
    "${x}",
    "{{7*7}}",
    "2**2**2**2**2",
    "9^9^9^9",
    "99999!",
    "factorial(10^9)",
    "1e999999",
    "0^-1",
    "log(0)",
    "x" * 3000,
    "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((x"
    "))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))",
]
VALUES = [
    '"x"',
    "1",
    "-3",
    "1.5e300",
    "true",
    "[]",
    '[1, "a"]',
    "{ a = 1 }",
    '"""multi\nline"""',
    "nan",
    "inf",
    "1979-05-27",
    '"qk-gl"',
    '"holds"',
    '"fails"',
    '["lean", "nope"]',
    '["symbolic", "symbolic"]',
    "{",
    '"unterminated',
    "[[",
    "0x10",
    "99999999999999999999999999",
] + [repr(p).replace("'", '"') for p in PAYLOADS]
KEYS = [
    "id",
    "source",
    "location",
    "statement",
    "kind",
    "checkers",
    "params",
    "formula",
    "claimed_value",
    "claimed_percent",
    "relation",
    "action",
    "expected",
    "corrected_action",
    "models",
    "note",
    "evil",
    "__class__",
    "títle",
    "document",
    "claim",
    "[claim]",
    "[[claim]]",
    "[document]",
]


def _base_texts() -> list[str]:
    texts = []
    for path in sorted(CATALOG_DIR.glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        head, *blocks = text.split("[[claim]]")
        for i in range(0, len(blocks), 2):  # small documents: header + up to two claims
            texts.append(head + "".join("[[claim]]" + b for b in blocks[i : i + 2]))
    return texts


def _mutate(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(10)
        i = rng.randrange(len(lines)) if lines else 0
        if op == 0 and lines:
            del lines[i]
        elif op == 1 and lines:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 2 and lines and "=" in lines[i]:
            key = lines[i].split("=", 1)[0]
            lines[i] = f"{key}= {rng.choice(VALUES)}"
        elif op == 3:
            lines.insert(i, f"{rng.choice(KEYS)} = {rng.choice(VALUES)}")
        elif op == 4 and lines and "=" in lines[i]:
            key, value = lines[i].split("=", 1)
            lines[i] = f"{rng.choice(KEYS)} ={value}"
        elif op == 5:
            cut = rng.randrange(len("\n".join(lines)) + 1)
            lines = "\n".join(lines)[:cut].split("\n")
        elif op == 6 and lines:
            pos = rng.randrange(len(lines[i]) + 1)
            lines[i] = (
                lines[i][:pos]
                + rng.choice(["\x00", "\ud7ff", "é", "'", '"', "\\", "]", "[", "#", "\t", "\u202e", "=", "{", "}"])
                + lines[i][pos:]
            )
        elif op == 7:
            lines.insert(i, rng.choice(["[[claim]]", "[document]", "[claim]", "[params]", "[[document]]"]))
        elif op == 8 and lines and "=" in lines[i]:
            key = lines[i].split("=", 1)[0]
            lines[i] = f"{key}= {rng.choice(PAYLOADS)!r}".replace("'", '"')
        elif op == 9:
            block = "\n".join(lines)
            lines = (block + "\n" + block[block.find("[[claim]]") :]).split("\n")  # duplicate ids
    return "\n".join(lines)


def test_fuzz_malformed_claim_files(canary):
    rng = random.Random(20261129)
    bases = _base_texts()
    outcomes = {"loaded": 0, "rejected": 0}
    for n in range(N_FILES):
        text = _mutate(rng.choice(bases), rng)
        try:
            load_text(text, f"fuzz{n}.toml")
            outcomes["loaded"] += 1
        except GaugeAuditError as exc:
            # every problem of the file, one FILE:LINE line each
            assert exc.lines and all(ln.startswith(f"fuzz{n}.toml:") and "\n" not in ln for ln in exc.lines), exc.lines
            outcomes["rejected"] += 1
    print(outcomes)
    assert outcomes["rejected"] > N_FILES // 2  # the mutations really are malformed
    assert canary == [], f"eval/exec/compile called while loading claim files: {set(canary)}"


FORMULA_ATOMS = [
    "h",
    "d_k",
    "d_v",
    "n_t",
    "2",
    "0",
    "1.3",
    "1e3",
    "log(",
    "sqrt(",
    "factorial(",
    "binomial(",
    "min(",
    "+",
    "-",
    "*",
    "/",
    "^",
    "**",
    "!",
    "(",
    ")",
    ",",
    " ",
    "pi",
    "exp(",
    "__",
    ".",
    "'",
    ";",
]


def _mutate_chars(rng: random.Random, text: str, atoms: list[str]) -> str:
    """1–5 edits: delete a character or insert an atom."""
    s = list(text)
    for _ in range(rng.randint(1, 5)):
        pos = rng.randrange(len(s) + 1)
        if rng.random() < 0.5 and s:
            del s[min(pos, len(s) - 1)]
        else:
            s[pos:pos] = rng.choice(atoms)
    return "".join(s)


def test_fuzz_formula_mutations(canary):
    rng = random.Random(7)
    seeds = [
        "2*n_t*n_h*d_h^2 + (d_e-1)*(d_e-2)/2",
        "h*(d_k^2+d_v^2) + log(h!)",
        "L*h*(d_k^2 + d_v^2)",
        "P/log(P)",
        "n_q*d_k^2 + n_kv*d_v^2",
    ] + PAYLOADS
    ok = bad = 0
    for _ in range(N_FORMULAS_MUTATED):
        try:
            parse_formula(_mutate_chars(rng, rng.choice(seeds), FORMULA_ATOMS + PAYLOADS[:6]))
            ok += 1
        except GaugeAuditError as exc:
            assert "\n" not in str(exc)
            bad += 1
    print({"parsed": ok, "rejected": bad})
    assert ok > 0 and bad > 0
    assert canary == [], f"eval/exec/compile called while parsing formulas: {set(canary)}"


@settings(
    max_examples=N_FORMULAS_HYPOTHESIS,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.sampled_from(FORMULA_ATOMS + PAYLOADS[:8]) | st.text(max_size=4), max_size=12))
def test_fuzz_formula_hypothesis(canary, parts):
    text = "".join(parts)
    before = len(canary)  # hypothesis itself may compile code between examples
    try:
        parse_formula(text)
    except GaugeAuditError as exc:
        assert "\n" not in str(exc)
    assert canary[before:] == [], f"eval/exec/compile called while parsing {text!r}"


def test_canary_would_fire_under_default_sympify(tmp_path, monkeypatch):
    """The payloads are live: the default-namespace sympify (what the loader must never
    call) does import the canary module.  So the absence of the marker above is evidence."""
    import sympy

    marker = tmp_path / "FIRED"
    (tmp_path / "ga_canary_probe.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        sympy.sympify("__import__('ga_canary_probe')")
    except Exception:  # sympify may choke on the module object afterwards; the import already happened
        pass
    assert marker.exists()
    sys.modules.pop("ga_canary_probe", None)


# ----------------------------------------------------------------------------- rule expressions
N_RULE_MUTATED = 6_000
N_RULE_HYPOTHESIS = 3_000
N_RULE_FILES = 3_000
RULE_SYMBOLS = symbols_for(
    [
        Element("M", "GL", "d_k"),
        Element("s", "diagonal", "d_v"),
        Element("c", "translation", "d_v"),
        Element("R", "SO1", "d_model"),
        Element("k", "scalar", None),
    ]
)
RULE_SEEDS = [
    "W_K @ inv(transpose(M))",
    "inv(diag(s)) @ W_O",
    "b_O - c @ W_O",
    "transpose(R) @ W_Q",
    "inv(diag(norm1.w)) @ transpose(R) @ diag(norm1.w) @ W_Q",
    "norm1.w * ones(d_model)",
    "W_Q @ M + outer(ones(d_model), b_Q)",
    "k * W_V @ eye(d_v)",
    "-(b_V @ diag(s))",
] + PAYLOADS
RULE_ATOMS = [
    "W_Q",
    "W_K",
    "W_O",
    "b_O",
    "norm1.w",
    "M",
    "s",
    "c",
    "R",
    "k",
    "@",
    "*",
    "+",
    "-",
    "(",
    ")",
    ",",
    "inv(",
    "transpose(",
    "diag(",
    "outer(",
    "ones(",
    "eye(",
    "d_k",
    "d_model",
    "2",
    "0",
    "1e400",
    ".",
    "..",
    "'",
    ";",
    "__",
    "norm1.",
    " ",
    "eval(",
    "M.T",
    "M**2",
    "λ",
]


def _check_rule_error(exc: GaugeAuditError) -> None:
    assert exc.lines and all("\n" not in ln for ln in exc.lines)


def _try_rule(text: str) -> bool:
    try:
        parse_expression(text, RULE_SYMBOLS)
        return True
    except GaugeAuditError as exc:
        _check_rule_error(exc)
        return False


def test_fuzz_rule_expression_mutations(canary):
    rng = random.Random(15)
    ok = bad = 0
    names = ["W_Q", "W_K", "W_V", "W_O", "b_O", "b_V", "M", "s", "c", "R", "k", "norm1.w", "d_k", "d_v", "d_model"]
    for _ in range(N_RULE_MUTATED):
        text = rng.choice(RULE_SEEDS)
        if rng.random() < 0.4:  # swap names: well-formed text whose shapes or invertibility may not fit
            for _ in range(rng.randint(1, 2)):
                old = rng.choice(names)
                text = text.replace(old, rng.choice(names), 1)
            if rng.random() < 0.5:
                ok, bad = (ok + 1, bad) if _try_rule(text) else (ok, bad + 1)
                continue
        if _try_rule(_mutate_chars(rng, text, RULE_ATOMS + PAYLOADS[:6])):
            ok += 1
        else:
            bad += 1
    print({"parsed": ok, "rejected": bad})
    assert ok > 0 and bad > 0
    assert canary == [], f"eval/exec/compile called while parsing rule expressions: {set(canary)}"


@settings(
    max_examples=N_RULE_HYPOTHESIS,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.sampled_from(RULE_ATOMS + PAYLOADS[:8]) | st.text(max_size=4), max_size=14))
def test_fuzz_rule_expression_hypothesis(canary, parts):
    text = "".join(parts)
    before = len(canary)
    try:
        parse_expression(text, RULE_SYMBOLS)
    except GaugeAuditError as exc:
        _check_rule_error(exc)
    assert canary[before:] == [], f"eval/exec/compile called while parsing {text!r}"


RULE_VALUES = [
    '"GL(d_k)"',
    '"SO1(d_model)"',
    '"diagonal(0)"',
    '"translation(d_q)"',
    '"scalar"',
    '"Foo(3)"',
    "3",
    '{ w = "x" }',
    '"W_K @ inv(M)"',
    '"inv(diag(c)) @ W_O"',
    '"W_Q @ M @"',
    '"head"',
    '"heads"',
    '"b_U"',
    '"W_Q @ W_Q"',
] + [repr(p).replace("'", '"') for p in PAYLOADS]
RULE_KEYS = [
    "scope",
    "elements",
    "maps",
    "M",
    "N",
    "s",
    "W_Q",
    "W_K",
    "b_K",
    "norm1.w",
    '"norm1.w"',
    "W_Z",
    "[claim.rule]",
    "[claim.rule.maps]",
    "[claim.rule.elements]",
    "evil",
    "__class__",
]


def _rule_texts() -> list[str]:
    text = (CATALOG_DIR / "examples" / "catalog_as_rules.toml").read_text(encoding="utf-8")
    head, *blocks = text.split("[[claim]]")
    return [head + "[[claim]]" + b for b in blocks]


def test_fuzz_rule_tables(canary):
    rng = random.Random(20261215)
    bases = _rule_texts()
    outcomes = {"loaded": 0, "rejected": 0}
    for n in range(N_RULE_FILES):
        lines = rng.choice(bases).split("\n")
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(lines))
            op = rng.randrange(5)
            if op == 0 and "=" in lines[i]:
                key = lines[i].split("=", 1)[0]
                lines[i] = f"{key}= {rng.choice(RULE_VALUES)}"
            elif op == 1:
                lines.insert(i, f"{rng.choice(RULE_KEYS)} = {rng.choice(RULE_VALUES)}")
            elif op == 2 and lines:
                del lines[i]
            elif op == 3 and "=" in lines[i]:
                key, value = lines[i].split("=", 1)
                lines[i] = f"{rng.choice(RULE_KEYS)} ={value}"
            else:
                pos = rng.randrange(len(lines[i]) + 1)
                lines[i] = lines[i][:pos] + rng.choice(RULE_ATOMS + ['"', "]", "[", "{", "}"]) + lines[i][pos:]
        try:
            load_text("\n".join(lines), f"rule{n}.toml")
            outcomes["loaded"] += 1
        except GaugeAuditError as exc:
            assert exc.lines and all(ln.startswith(f"rule{n}.toml:") and "\n" not in ln for ln in exc.lines), exc.lines
            outcomes["rejected"] += 1
    print(outcomes)
    assert outcomes["rejected"] > N_RULE_FILES // 2 and outcomes["loaded"] > 0
    assert canary == [], f"eval/exec/compile called while loading rule tables: {set(canary)}"
