"""Check the faiss install: one faiss distribution, it imports, and a flat index finds the right neighbours.

    python tools/check_faiss.py                           # any working faiss; CPU index, plus a GPU index if a GPU is seen
    python tools/check_faiss.py --expect gpu              # the build must have GPU support (the Docker build step)
    python tools/check_faiss.py --expect gpu --require-gpu  # ... and must run on a GPU (`docker run --gpus all ...`)

What it checks (exit status 1 if any check fails, 0 otherwise):

* exactly one of the distributions that ship the ``faiss`` package is installed. faiss-cpu and faiss-gpu-cu12 write
  the same ``faiss/`` files, so a second one overwrites the first, and uninstalling either deletes files both use;
* ``import faiss`` gives the real module (not an empty namespace package left behind by such an uninstall);
* GPU support is compiled in (``faiss.StandardGpuResources``) when ``--expect gpu``, and absent when ``--expect cpu``;
* ``IndexFlatL2`` and ``IndexFlatIP`` (cosine on normalised vectors, as entity grounding uses it) return the exact
  nearest neighbours of a small seeded data set, computed independently with numpy;
* when a GPU is present (faiss or torch sees one), the same indexes moved to GPU 0 with ``index_cpu_to_gpu`` return
  the same neighbours; a GPU that torch sees but faiss does not is an error when the build has GPU support.

Nothing is downloaded; the CPU part takes well under a second.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

import numpy as np

#: distributions on PyPI that install the top-level ``faiss`` package
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu11", "faiss-gpu-cu12", "faiss")

N_BASE, N_QUERY, DIM, K = 2000, 16, 32, 5


def installed_faiss_distributions() -> dict[str, str]:
    """``{distribution: version}`` for each installed distribution that ships the ``faiss`` package."""
    found = {}
    for name in FAISS_DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A seeded base set, queries that are tiny perturbations of known base rows, and those rows' ids."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((N_BASE, DIM)).astype("float32")
    ids = rng.choice(N_BASE, size=N_QUERY, replace=False)
    queries = (base[ids] + 1e-3 * rng.standard_normal((N_QUERY, DIM))).astype("float32")
    return base, queries, ids


def exact_knn(base: np.ndarray, queries: np.ndarray, k: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-k in float64: squared L2 distances (ascending) or inner products (descending)."""
    b, q = base.astype("float64"), queries.astype("float64")
    if metric == "l2":
        scores = (q * q).sum(1)[:, None] - 2 * q @ b.T + (b * b).sum(1)[None, :]
        order = np.argsort(scores, axis=1, kind="stable")[:, :k]
    else:
        scores = q @ b.T
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def compare(name: str, got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray], ids) -> list[str]:
    """Mismatches between a faiss search result ``(D, I)`` and the exact answer (empty when they agree)."""
    (d_got, i_got), (d_want, i_want) = got, want
    errors = []
    if not np.array_equal(i_got[:, 0], ids):
        errors.append(f"{name}: nearest neighbours {i_got[:, 0].tolist()} != known answer {list(map(int, ids))}")
    if not np.array_equal(i_got, i_want):
        errors.append(
            f"{name}: top-{i_want.shape[1]} ids differ from brute force in {int((i_got != i_want).sum())} places"
        )
    elif not np.allclose(d_got, d_want, rtol=1e-3, atol=1e-3):
        errors.append(f"{name}: distances differ from brute force by up to {float(np.abs(d_got - d_want).max()):.3g}")
    return errors


def build_indexes(faiss, base: np.ndarray) -> dict:
    """Flat L2 on the raw vectors and flat inner product on L2-normalised vectors (cosine)."""
    l2 = faiss.IndexFlatL2(DIM)
    l2.add(base)
    unit = base.copy()
    faiss.normalize_L2(unit)
    ip = faiss.IndexFlatIP(DIM)
    ip.add(unit)
    return {"l2": (l2, base), "ip": (ip, unit)}


def search_all(indexes: dict, queries: np.ndarray, ids, where: str) -> list[str]:
    errors = []
    for metric, (index, vectors) in indexes.items():
        q = queries.copy()
        if metric == "ip":
            q /= np.linalg.norm(q, axis=1, keepdims=True)
        got = index.search(q, K)
        errors += compare(f"{where} IndexFlat{metric.upper()}", got, exact_knn(vectors, q, K, metric), ids)
    return errors


def torch_gpu_count() -> int:
    """GPUs that torch sees (0 when torch is missing or is a CPU build); a cross-check for ``faiss.get_num_gpus``."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check(expect: str = "any", require_gpu: bool = False, log=print) -> list[str]:
    """Run every check and return the errors found (empty: faiss works). ``log`` receives progress lines."""
    dists = installed_faiss_distributions()
    log("faiss distributions: " + (", ".join(f"{n} {v}" for n, v in dists.items()) or "none"))
    if len(dists) > 1:
        return [
            f"{len(dists)} faiss distributions installed ({', '.join(dists)}): they overwrite each other's "
            "faiss/ files; uninstall all of them, then install exactly one"
        ]
    try:
        import faiss
    except Exception as exc:  # ImportError, but also a broken shared library
        return [f"import faiss failed: {type(exc).__name__}: {exc}"]
    if getattr(faiss, "__file__", None) is None or not hasattr(faiss, "IndexFlatL2"):
        return [
            f"`import faiss` gives an empty package ({list(getattr(faiss, '__path__', []))}): its files were "
            "deleted, e.g. by uninstalling a second faiss distribution; reinstall the one you want"
        ]

    has_gpu_build = hasattr(faiss, "StandardGpuResources") and hasattr(faiss, "index_cpu_to_gpu")
    n_faiss = faiss.get_num_gpus() if has_gpu_build else 0
    # only a GPU build needs torch's cross-check (and torch is slow to import)
    n_torch = torch_gpu_count() if has_gpu_build else 0
    log(f"faiss {faiss.__version__} from {faiss.__file__}")
    log(
        f"GPU support compiled in: {'yes' if has_gpu_build else 'no'}"
        + (f"; GPUs seen by faiss: {n_faiss}, by torch: {n_torch}" if has_gpu_build else "")
    )

    errors = []
    if expect == "gpu" and not has_gpu_build:
        errors.append("expected a faiss build with GPU support (faiss-gpu-cu12), got a CPU-only build")
    if expect == "cpu" and has_gpu_build:
        errors.append("expected a CPU-only faiss build (faiss-cpu), got one with GPU support")

    base, queries, ids = make_data()
    indexes = build_indexes(faiss, base)
    cpu_errors = search_all(indexes, queries, ids, "CPU")
    log("CPU flat indexes (L2, cosine): " + ("FAILED" if cpu_errors else "ok"))
    errors += cpu_errors

    if has_gpu_build and n_faiss > 0:
        res = faiss.StandardGpuResources()
        gpu_indexes = {m: (faiss.index_cpu_to_gpu(res, 0, idx), vecs) for m, (idx, vecs) in indexes.items()}
        gpu_errors = search_all(gpu_indexes, queries, ids, "GPU")
        log("GPU flat indexes on device 0 (L2, cosine): " + ("FAILED" if gpu_errors else "ok"))
        errors += gpu_errors
    else:
        log("GPU flat indexes: skipped (" + ("no GPU seen" if has_gpu_build else "CPU-only build") + ")")
        if has_gpu_build and n_torch > 0:
            errors.append(f"torch sees {n_torch} GPU(s) but faiss sees none (CUDA driver too old for faiss-gpu-cu12?)")
        if require_gpu:
            errors.append("--require-gpu: no GPU index was run")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--expect",
        choices=("any", "cpu", "gpu"),
        default="any",
        help="which faiss build must be installed (default: any)",
    )
    parser.add_argument("--require-gpu", action="store_true", help="fail unless the GPU index ran")
    args = parser.parse_args(argv)
    errors = check(args.expect, args.require_gpu)
    for err in errors:
        print(f"ERROR: {err}", file=sys.stderr)
    print("faiss check: " + ("FAILED" if errors else "ok"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
