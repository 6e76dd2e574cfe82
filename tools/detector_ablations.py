"""KG-Guard's ablations (paper Tables 4-5) on any detection config: one ``kglightning seeds`` run per variant.

Each variant is the config plus a few detector options (:class:`~kglightning.modules.HallucinationDetector`):

* ``full``: the config as it is;
* ``w/o marking``, ``w/o virtual q. node``, ``w/o marking & virtual q. node`` (Table 4);
* ``w/o edge text``: relation texts left out of the edge features;
* ``graph only`` (the MLP does not read the question embedding) and ``question only`` (no graph encoder: the MLP
  reads the answer node's text and the question) (Table 5);
* ``+ path features``: the relation path from a topic entity to each answer, scored against the question, and its
  length (``data.init_args.answer_features``; not in the paper);
* the recipe for imbalanced and small sets: ``pos_weight 0.2``, ``focal, gamma 2``, ``bootstrap threshold (200)``
  (the median best-F1 threshold of 200 bootstrap resamples of validation) and ``paper budget`` (300 epochs,
  patience 50: ``configs/detector/paper_budget.yaml``).

Every variant is fitted and tested once per seed. ``--output`` gets one directory per variant (its ``seeds.json``
and plot; the run's relative paths, such as checkpoints and logs, resolve inside it, so the variants do not overwrite
one another or the config's own outputs) and ``ablations.md`` / ``ablations.json``: F1 and AUC-PR, mean ± std over
the seeds, and the change against ``full``. Options after the known ones go to every run, e.g. ``--trainer.max_epochs
30`` or ``--data.init_args.baselines null`` (the LLM baselines do not change the detector; leaving them out saves
loading their models, and a relative LLM ``cache_dir`` would not be found from the variant's directory anyway).

    PYTHONPATH=. python tools/detector_ablations.py --config configs/detector_kaping.yaml --seeds 0 1 2 \\
        --output outputs/detector_kaping/ablations --data.init_args.baselines null \\
        --data.init_args.max_records '{train: 600, validation: 200, test: 300}'

(with the same ``max_records`` as the ``seeds`` run whose answers are cached; without it every question of the
embedded benchmark is answered by the LLM first).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, list[str]] = {
    "full": [],
    "w/o marking": ["--model.init_args.marks", "false"],
    "w/o virtual q. node": ["--model.init_args.question_node", "false"],
    "w/o marking & virtual q. node": ["--model.init_args.marks", "false", "--model.init_args.question_node", "false"],
    "w/o edge text": ["--model.init_args.edge_text", "false"],
    "graph only": ["--model.init_args.inputs", "graph"],
    "question only": ["--model.init_args.inputs", "question"],
    "+ path features": ["--data.init_args.answer_features", "[path_score, hops]"],
    # the recipe for imbalanced, small sets (issue 13), on the full model
    "pos_weight 0.2": ["--model.init_args.pos_weight", "0.2"],
    "focal, gamma 2": ["--model.init_args.focal_gamma", "2"],
    "bootstrap threshold (200)": ["--model.init_args.threshold_resamples", "200"],
    "paper budget (300 epochs, patience 50)": ["--config", str(ROOT / "configs/detector/paper_budget.yaml")],
}
METRICS = ("f1", "auc_pr")


def table(results: dict[str, dict[str, dict[str, float]]], seeds: list[int]) -> str:
    """A markdown table: per variant, mean ± std of test F1 and AUC-PR (in points), their change against ``full``,
    and the validation score the checkpoints were chosen by (``best/<monitor>``, when the runs have one).

    Example:
        >>> r = {"full": {"test/f1": {"mean": 0.9, "std": 0.01}, "test/auc_pr": {"mean": 0.95, "std": 0.0}},
        ...      "graph only": {"test/f1": {"mean": 0.88, "std": 0.02}, "test/auc_pr": {"mean": 0.96, "std": 0.0}}}
        >>> print(table(r, [0, 1]).splitlines()[-1])
        | graph only | 88.0 ± 2.0 | -2.0 | 96.0 ± 0.0 | +1.0 | n/a |
    """
    monitor = next((k for summary in results.values() for k in summary if k.startswith("best/")), None)
    head = " | ".join(f"{m} | Δ" for m in ("F1", "AUC-PR"))
    lines = [f"| variant (seeds {', '.join(map(str, seeds))}) | {head} | {monitor or 'best/<monitor>'} |",
             "|---" + "|---:" * 5 + "|"]  # fmt: skip
    base = results.get("full")
    for name, summary in results.items():
        cells = []
        for metric in METRICS:
            s = summary.get(f"test/{metric}")
            if s is None:
                cells += ["n/a", ""]
                continue
            ref = base.get(f"test/{metric}") if base else None
            delta = f"{100 * (s['mean'] - ref['mean']):+.1f}" if ref and name != "full" else ""
            cells += [f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}", delta]
        chosen = summary.get(monitor) if monitor else None
        cells.append(f"{100 * chosen['mean']:.1f} ± {100 * chosen['std']:.1f}" if chosen else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a detection config (e.g. configs/detector_kaping.yaml)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--output", required=True, help="a directory for the variants' runs and the table")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="NAME",
                   help=f"which variants to run (default all): {', '.join(VARIANTS)}")  # fmt: skip
    args, overrides = p.parse_known_args()
    from kglightning.cli import main as cli_main

    config, out = Path(args.config).resolve(), Path(args.output).resolve()
    results: dict[str, dict[str, dict[str, float]]] = {}
    home = Path.cwd()
    for name in args.variants:
        workdir = out / re.sub(r"[^a-z0-9]+", "_", name.replace("+", "plus").lower()).strip("_")
        workdir.mkdir(parents=True, exist_ok=True)
        print(f"=== {name}: {' '.join(VARIANTS[name]) or '(the config)'} in {workdir}", flush=True)
        os.chdir(workdir)
        try:
            code = cli_main(["seeds", "--config", str(config), "--seeds", *map(str, args.seeds),
                             "--output", str(workdir / "seeds.json"), *VARIANTS[name], *overrides])  # fmt: skip
        finally:
            os.chdir(home)
        if code:
            raise SystemExit(f"variant {name!r} failed (exit code {code})")
        results[name] = json.loads((workdir / "seeds.json").read_text())["summary"]
    md = table(results, args.seeds)
    (out / "ablations.md").write_text(md + "\n")
    (out / "ablations.json").write_text(json.dumps({"seeds": args.seeds, "variants": VARIANTS, "summary": results},
                                                   indent=2) + "\n")  # fmt: skip
    print(md)
    print(f"wrote {out / 'ablations.md'} and {out / 'ablations.json'}")


if __name__ == "__main__":
    main()
