"""Generate the table "what survives, architecture by architecture" of ``docs/concepts/checkpoints.md``
and its short form in ``README.md``.

    python -m gauge_audit.report.groups_md            # print the page and the README
    python -m gauge_audit.report.groups_md --write    # rewrite both tables
    python -m gauge_audit.report.groups_md --check    # exit 1 if a committed table is stale

Each row is :func:`gauge_audit.nullity.groups.factors` of one architecture at its small default sizes
(what ``gauge-audit groups ARCH --json`` prints); the cells are the command's own strings, so the page
cannot drift from the theory.  Each table sits between two HTML comments; the rest of the page is
left as written.  ``tests/test_docs.py`` fails when the committed table differs.
"""

from __future__ import annotations

import sys

from ..claims import ROOT
from ..models import config_of
from ..models.architectures import ARCHITECTURES
from ..nullity.groups import discrete, factors
from .generated import generated_file_main

PAGE = ROOT / "docs" / "concepts" / "checkpoints.md"
README = ROOT / "README.md"
START, END = "<!-- groups-table: start -->", "<!-- groups-table: end -->"
#: (row title, architecture name of ``nullity --family`` or a built-in model)
ROWS = [
    ("GPT-2", "gpt2"),
    ("BERT", "bert"),
    ("LLaMA / Llama 3.x", "llama"),
    ("Mistral", "mistral"),
    ("Qwen2", "qwen"),
    ("Qwen3", "qwen3"),
    ("Gemma 2", "gemma2"),
    ("Gemma 3", "gemma3-tiny"),
    ("OLMo 2", "olmo2"),
    ("Phi-3", "phi3"),
    ("GPT-NeoX / Pythia", "neox"),
    ("DeepSeek-V3 (MLA)", "deepseek"),
]
_BIASES = ("key bias", "value bias", "parallel")
#: the factors of each column: DeepSeek's MLA splits QK in two and its FFN by layer kind
_SLOTS = {
    "latents": ("latents", "latent norms"),
    "QK": ("QK", "QK rope"),
    "VO": ("VO",),
    "FFN": ("FFN", "experts", "router", "router weights"),
}
_PER = {"every layer": "layer", "dense layers": "dense layer", "MoE layers": "MoE layer"}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _slot(f: dict, k: str) -> str:
    return "; ".join(f"{f[n].group} ({f[n].dim}/{_PER[f[n].scope]})" for n in _SLOTS[k] if n in f) or "—"


def table() -> str:
    lines = [
        "| architecture | latents | QK | VO | FFN | biases | stream | discrete | vs G_max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for title, name in ROWS:
        cfg = ARCHITECTURES[name].config() if name in ARCHITECTURES else config_of(name)
        f = {x.name: x for x in factors(cfg)}

        biases = "; ".join(f[k].group for k in _BIASES if k in f) or "—"
        diffs = "; ".join(f"{k}: {x.differs}" for k, x in f.items() if x.differs not in ("", "=", "beyond G_max"))
        stream = f"{f['stream'].group} ({f['stream'].dim})" if "stream" in f else "—"
        cells = [title, *(_slot(f, k) for k in _SLOTS), biases, stream, "; ".join(discrete(cfg))]
        cells.append(diffs or "the G_max slots agree (FFN, stream, biases: beyond G_max)")
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _dims(f: dict, slot: str) -> str:
    return " + ".join(str(f[n].dim) for n in _SLOTS[slot] if n in f) or "0"


def compact() -> str:
    """The README's short form: per layer the continuous group of each slot, its dimension, and the
    slots where G_max's prediction is not the group (details: the full table)."""
    lines = [
        "| architecture | QK / layer | VO / layer | FFN / layer | stream | differs from G_max |",
        "|---|---|---|---|---|---|",
    ]
    for title, name in ROWS:
        cfg = ARCHITECTURES[name].config() if name in ARCHITECTURES else config_of(name)
        f = {x.name: x for x in factors(cfg)}
        differs = sorted({_COLUMN.get(k, k) for k, x in f.items() if x.differs not in ("", "=", "beyond G_max")})
        stream = str(f["stream"].dim) if "stream" in f else "0"
        cells = [title, _dims(f, "QK"), _dims(f, "VO"), _dims(f, "FFN"), stream, ", ".join(differs) or "—"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


#: factor name → the column it is reported under
_COLUMN = {n: slot for slot, names in _SLOTS.items() for n in names}


def _between(page: str, body: str) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body}{END}{tail}"


def render() -> str:
    return _between(PAGE.read_text(encoding="utf-8"), table())


def render_readme() -> str:
    return _between(README.read_text(encoding="utf-8"), compact())


def main(argv=None) -> int:
    rc = generated_file_main("gauge_audit.report.groups_md", PAGE, render, argv)
    return rc or generated_file_main("gauge_audit.report.groups_md", README, render_readme, argv)


if __name__ == "__main__":
    sys.exit(main())
