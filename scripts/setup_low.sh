#!/usr/bin/env bash
# Create .venv-low: forcedweight at the LOW end of its transformers range (4.57.x, the newest 4.57
# release) with the `peers` extra (kvpress 0.5.5, which pins transformers<5.3). CI reruns the capture,
# ragged-cache, evaluate and kvpress-adapter tests there (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-low/bin/python ] || "$PY" -m venv .venv-low
.venv-low/bin/python -m pip install -q --upgrade pip
.venv-low/bin/python -m pip install -q torch==2.13.0
.venv-low/bin/python -m pip install -q -e '.[dev,peers]' 'transformers==4.57.6'
