"""Write the numbers of README.md and the docs from the result files the runs wrote, so each has one source.

A block of a page between ``<!-- numbers: NAME -->`` and ``<!-- numbers: end -->`` is generated: its text is what
:data:`BLOCKS` ``[NAME]`` renders from the result files in ``docs/results/`` (written by ``tools/record_run.py``).

The pages checked (:data:`PAGES`) are README.md, the home page, every method, guide and tutorial page, the data,
benchmark and architecture pages, and
BENCHMARKS.md above its heading ``## Dated records`` (:data:`HISTORY`: below it, each section is one dated run, kept as
history). Outside the blocks, fenced code and inline code, a checked page may not hold a number that looks like a
result:

- anywhere on the page: three or more decimals (``0.953``, ``0.9535``: a metric), a metric named with a value of two
  decimals or a share (``F1 0.96``, ``0.96 F1``, ``an FDR of 0.30``, ``F1 95.8%``), a ratio of two decimals
  (``2.98x``) or with a decimal in words (``1.7 times as many``), a time in minutes and seconds (``3 min 6 s``,
  ``3:38``), a time something took, takes or needed (``took 14 s``, ``takes about 12 s``, ``took **77 to 80 ms**``,
  ``ran in 69 s``; a setting is written otherwise: ``a timeout of 30 s``), an estimated time or a rate
  (``about 2 s``, ``5 ms per request``; :data:`TIME`, which the package's docstrings are read for too);
- in a method page's results sections (:data:`RESULTS_SECTIONS`, named by their headings; a section runs to the
  next heading of its level or above), also a share (``91.9%``) and a decimal number in a table cell
  (``| 87.5 |``, ``| 93.3 / 101.2 |``), the form results take there. Prose decimals (``alpha = 0.2``, ``lr 5e-5``)
  and tables outside those sections are not read for them: they are settings.

Every checked page is read as a whole (BENCHMARKS.md down to its history); no other section is exempt. Results of
runs that no result file records (LLM runs of an hour, data not on the machines) live in BENCHMARKS.md as dated
records: a method page says in words what such a run showed and links to its record.

    python tools/docs_numbers.py           # rewrite every block from the result files
    python tools/docs_numbers.py --check   # exit 1, naming the page and block, when one is not what it would write,
                                           # or naming a result-like number written outside the blocks

``tests/tools/test_docs_numbers.py`` runs the check, so a table edited by hand, or a result file recorded again
without its pages, fails the tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = ("README.md", "docs/index.md", "BENCHMARKS.md", "docs/benchmark.md", "docs/data.md", "docs/architecture.md",
         *sorted(str(p.relative_to(ROOT)) for d in ("methods", "guides", "tutorials")
                 for p in (ROOT / "docs" / d).glob("*.md")))  # fmt: skip
#: pages checked only above a heading: below it are dated records (history) this check does not read
HISTORY = {"BENCHMARKS.md": "## Dated records"}
RENDER_ONLY: tuple[str, ...] = ()
BLOCK = re.compile(r"(<!-- numbers: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- numbers: end -->)", flags=re.S)
COLUMNS = (("F1", "f1"), ("Precision", "precision"), ("Recall", "recall"), ("Accuracy", "acc"),
           ("AUC-PR", "auc_pr"), ("AUROC", "auroc"))  # fmt: skip
# the main table's rows: label, result file, metric prefix (the detector's own metrics have none); a detector's label
# gains its config's width and the epochs its run trained
MAIN_ROWS = (
    ("KG-Guard (GraphTransformer), `configs/detector.yaml`", "main_job", "test/"),
    ("KG-Guard (GAT), `configs/detector_gat.yaml`", "detector_gat", "test/"),
    ("Structural baseline (logistic regression on rank, list length, degree, hops, graph size; fitted on train)",
     "main_job", "test/structural/"),
    ("MostFrequent (validation majority: hallucinated)", "main_job", "test/mostfrequent/"),
    ("Random (uniform score, flagged at 0.5)", "main_job", "test/random/"),
)  # fmt: skip
DETECTORS, BASELINES = MAIN_ROWS[:2], MAIN_ROWS[2:]
METRIC = r"(?:F1|AUC-PR|AUROC|precision|recall|accuracy|ECE|coverage|FDR|ECR|Hits@1)"
# a time in minutes and seconds (``3 min 6 s``); a time that something took, takes or needed (``took 14 s``,
# ``takes about 12 s``, ``took **77 to 80 ms**``, ``ran in 69 s``): a measurement (not ``took 4 min 2 s``, a clock
# time); an estimated time (``builds in about 2 s``, ``roughly 5 ms``, ``~2 s``, ``about 2 to 3 min``) or a rate
# (``2.5 s for a million triples``, ``12 ms per request``, ``5 ms/request``)
_UNIT = r"(?:ms|s|seconds?|min|minutes?|h|hours?)"
_RANGE = r"(?:\d[\d,.]*\s?(?:to|\u2013|-)\s?)?"
TIME = re.compile(
    r"\b\d+ min \d+ s\b"
    r"|\b(?:took|takes|take|taking|ran in|runs in|run in|needed|needs|lasted|finished in|finishes in)\s+"
    r"(?:(?:about|only|under|over|nearly|roughly|around|almost|approximately|some|just|less than|more than)\s+)?\**"
    rf"{_RANGE}\d[\d,.]*\**\s?\**{_UNIT}\b\**(?!\s\d+\s?s\b)"
    rf"|(?:\b(?:about|roughly|around|nearly|almost|approximately)\s+|~\s?)\**{_RANGE}\d(?:[\d,.]*\d)?\**\s?{_UNIT}\b"
    r"|(?<![\w.,])\d(?:[\d,.]*\d)?\s?(?:ms|s|seconds?|min|minutes?)(?:\s+per\s|/[a-z]"
    r"|\s+for\s+(?:a|an|one|two|three|each|every|\d[\d,.]*)\s)",
    flags=re.I,
)
# numbers that only a result file may give: three or more decimals (a metric), a metric's name with a value of two
# decimals or a share (``F1 0.96``, ``0.96 F1``, ``an FDR of 0.30``, ``F1 95.8%``), a ratio of two decimals
# (``2.98x``) or with a decimal in words (``1.7 times as many``), a clock time (``3:38``), or a time (:data:`TIME`)
STRAY = re.compile(
    r"(?<![\w.])[01]\.\d{3,}(?!\d)|(?<![\w:.])\d{1,2}:\d{2}(?![\w:])"
    rf"|\b{METRIC}(?:\s+(?:of|=|was))?\s+(?:0\.\d\d\b|\d{{1,3}}(?:\.\d+)?%)|(?<![\w.])0\.\d\d\s+{METRIC}\b"
    r"|(?<![\w.])\d+\.\d\dx\b"  # a ratio of two decimals (2.98x)
    r"|(?<![\w.])\d+\.\d+\s+times\s+as\b"  # a measured ratio in words (``1.7 times as many requests``)
    rf"|{TIME.pattern}",
    flags=re.I,
)
# each method page's results sections, by heading: there a share, or a decimal number in a table cell, is a result too
RESULTS_SECTIONS = {
    "docs/methods/kg-guard.md": ("## Results on the embedded test split", "## What the detector catches and misses"),
    "docs/methods/sgic.md": ("### A CPU run (bundled SmolLM2-135M)", "## Fine-tuning the calibrator"),
    "docs/methods/uag.md": ("## Results on the embedded test split", "## The evaluator in the loop, and the paper's grid",
                            "## LLM baselines: Top-K and split CP on the LLM's scores, CLM and LoFreeCP"),
    "docs/methods/doublycal.md": ("## Results with the bundled SmolLM2-135M (embedded test split)",
                                  "### SFT and GRPO proxies on the embedded test split (bundled SmolLM2-135M, CPU)",
                                  "### Confidence after the path, decoded through the KG-Trie"),
    "docs/methods/trust.md": ("## GNN-RAG's WebQSP answers",),
}  # fmt: skip
# in those sections, a share is a result too, and so is a decimal number in a table cell
STRAY_SHARE = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d)?%")
TABLE_DECIMAL = re.compile(r"(?<=\|)[ *]*(\d+\.\d+)(?:[ *]*/[ *]*\d+(?:\.\d+)?)?[ *]*(?=\|)")


def load(name: str) -> dict:
    """``docs/results/<name>.json``."""
    path = RESULTS / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"{path.relative_to(ROOT)}: no such result file (write it with tools/record_run.py)") from None


def _metric(result: dict, key: str, name: str) -> float:
    try:
        return float(result["metrics"][key])
    except KeyError:
        raise SystemExit(f"docs/results/{name}.json: no metric {key!r}") from None


def _growth(share: float) -> str:
    """A relative change with its sign, one decimal: ``+1.2%``, and ``0.0%`` where it rounds to nothing (not
    ``-0.0%``)."""
    return "0.0%" if round(share * 100, 1) == 0 else f"{share:+.1%}"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _cores(machine: dict) -> str:
    """``2 CPU cores (Intel Xeon, no GPU)``: the machine a run was timed on."""
    gpu = "GPU " + machine["gpu"] if machine.get("gpu") else "no GPU"
    return f"{machine['cores']} CPU cores ({machine['cpu']}, {gpu})"


def _where(result: dict) -> str:
    machine = result["machine"]
    return f"GPU ({machine['gpu']})" if machine.get("gpu") else f"CPU ({machine['cores']} cores, no GPU)"


def _verified(*names: str) -> str:
    results = [load(n) for n in names]
    runs = "; ".join(
        f"`docs/results/{n}.json`, {r['date']}, commit {r.get('commit') or 'unknown'}, seed {r['config']['seed']}, "
        f"{_where(r)}"
        for n, r in zip(names, results)
    )
    return f"Last verified from an empty cache, each threshold tuned on validation: {runs}."


def _label(label: str, result: dict) -> str:
    config = result["config"]
    return f"{label} (hidden {config['hidden_channels']}, {result['epochs_trained']} epochs trained)"


def main_table() -> str:
    """The detector against the baselines on the embedded test split, and what the rows show."""
    results = {name: load(name) for _, name, _ in MAIN_ROWS}
    test = results["main_job"]["splits"]["test"]
    for name, result in results.items():
        if result["splits"].get("test") != test:
            raise SystemExit(f"docs/results/{name}.json: its test split {result['splits'].get('test')} is not the one "
                             f"of docs/results/main_job.json {test}; record both on the same data")  # fmt: skip
    values = [[_metric(results[name], prefix + key, name) for _, key in COLUMNS] for _, name, prefix in MAIN_ROWS]
    best = [max(column) for column in zip(*values)]
    lines = [
        f"Flagging hallucinated answers among the {test['answers']:,} answer nodes that the KBQA baseline proposed for "
        f"the {test['questions']:,} test questions ({test['hallucinated_percent']:.1f}% of them wrong):",
        "",
        "| detector | " + " | ".join(header for header, _ in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for i, ((label, name, _), row) in enumerate(zip(MAIN_ROWS, values)):
        cells = [f"**{v:.3f}**" if f"{v:.3f}" == f"{b:.3f}" else f"{v:.3f}" for v, b in zip(row, best)]
        label = _label(label, results[name]) if i < len(DETECTORS) else label
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    runs = [results[name] for _, name, _ in DETECTORS]
    return "\n".join([*lines, "", _findings(values, runs), "", _verified("main_job", "detector_gat")]) + "\n"


def _findings(values: list[list[float]], runs: list[dict] | None = None) -> str:
    """What the table shows, in words, read from its values (as displayed: three decimals)."""
    shown = [[round(v, 3) for v in row] for row in values]
    detectors, baselines = shown[: len(DETECTORS)], shown[len(DETECTORS) :]
    ahead = [h for j, (h, _) in enumerate(COLUMNS) if min(d[j] for d in detectors) > max(b[j] for b in baselines)]
    behind = [h for h, _ in COLUMNS if h not in ahead]
    text = ("Both detectors score above every baseline on " + ", ".join(ahead) if ahead else
            "No metric has both detectors above every baseline")  # fmt: skip
    if behind:
        text += "; not on " + ", ".join(behind)
        if "Recall" in behind:
            text += " (flagging every answer, as MostFrequent does, has a recall of 1)"
    first, second = detectors
    wins = sum(a > b for a, b in zip(first, second))
    losses = sum(a < b for a, b in zip(first, second))
    apart = ""
    if runs and len({(r.get("commit"), r.get("machine", {}).get("cpu")) for r in runs}) > 1:
        apart = " The two detectors' runs differ in commit or machine (below), which can move the third decimal."
    return (f"{text}. The GraphTransformer is ahead of the GAT on {wins} of {len(COLUMNS)} metrics and behind on "
            f"{losses} (the paper found it ahead).{apart}")  # fmt: skip


def main_job_time() -> str:
    """How long the README's first command took when it was last recorded."""
    main = load("main_job")
    text = (
        f"On {_cores(main['machine'])} the main job's "
        f"`fit` took **{_duration(main['fit_seconds'])}** "
        f"on {main['date']} (commit {main['commit']}) from an empty cache (the benchmark, the baseline's answers and "
        "the text encodings built, "
        f"then training and the test)"
    )
    if "install_seconds" in main:
        text += f", after {_duration(main['install_seconds'])} for `tools/install.sh` (run again on a machine that " \
                "had the packages)"  # fmt: skip
    text += "."
    if "rerun" in main:
        rerun = main["rerun"]
        same = "the same test metrics to the last digit" if rerun["identical_metrics"] else (
            "different test metrics (" + ", ".join(rerun["differing"]) + ")")  # fmt: skip
        text += f" A rerun on the cache it filled took {_duration(rerun['fit_seconds'])} and gave {same}."
    return text + (
        " Timings on shared machines vary from hour to hour, and another CPU model's float arithmetic moves the "
        "test metrics a little (BENCHMARKS.md has an AMD EPYC's run of the same config).\n"
    )


def test_suite() -> str:
    """How long the README's test command took when it was last recorded, and what it counted."""
    run = load("test_suite")
    counts = run["counts"]
    skipped = f", {counts['skipped']:,} skipped" if counts.get("skipped") else ""
    return (
        f"On {run['machine']['cores']} CPU cores, `{run['command']}` passed {counts.get('passed', 0):,} tests{skipped} in "
        f"**{_duration(run['seconds'])}** on {run['date']} (commit {run.get('commit') or 'unknown'}, "
        f"`docs/results/test_suite.json`).\n"
    )


MISSES = "kind of mistake (hallucinated answers)"  # tools/detector_misses.py's group of the hallucinated answers


def _share(x: float) -> str:
    return "–" if x != x else f"{x:.1%}"  # nan: no answer of that class in the group


def misses_table() -> str:
    """What the main job's detector catches and misses, by question length and by kind of mistake."""
    run, main = load("detector_misses"), load("main_job")
    if json.dumps(run["metrics"], sort_keys=True) != json.dumps(main["metrics"], sort_keys=True):  # NaN equals NaN
        raise SystemExit("docs/results/detector_misses.json: its run's test metrics are not those of "
                         "docs/results/main_job.json, so its checkpoint is not the main job's; record both again")  # fmt: skip
    groups = run["misses"]["groups"]
    _check_pooled_recall(groups, run["metrics"]["test/recall"])
    hops = sorted(
        groups.get("hops", []),
        key=lambda r: (not r["group"].isdigit(), int(r["group"]) if r["group"].isdigit() else 0, r["group"]),
    )
    mistakes = sorted(groups[MISSES], key=lambda r: -r["nodes"])
    lines = ["| group | answer nodes | hallucinated | caught (recall) | false alarms (faithful flagged) |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in hops:
        label = f"questions of {r['group']} hop{'s' if r['group'] != '1' else ''}" if r["group"].isdigit() else \
            "questions of unknown length"  # fmt: skip
        lines.append(f"| {label} | {r['nodes']:,} | {_share(r['hallucinated'])} | {_share(r['recall'])} | "
                     f"{_share(r['false_alarms'])} |")  # fmt: skip
    for r in mistakes:
        lines.append(f"| mistake: {r['group']} | {r['nodes']:,} | {_share(r['hallucinated'])} | "
                     f"{_share(r['recall'])} | |")  # fmt: skip
    return "\n".join([*lines, "", _misses_findings(hops, mistakes), "", _misses_verified(run)]) + "\n"


def _check_pooled_recall(groups: dict, recall: float) -> None:
    """The groups must pool to the run's test recall (they were scored with its checkpoint and thresholds)."""
    pos = sum(r["nodes"] * r["hallucinated"] for r in groups["grounding"])
    caught = sum(
        r["nodes"] * r["hallucinated"] * r["recall"] for r in groups["grounding"] if r["recall"] == r["recall"]
    )
    if pos and abs(caught / pos - recall) > 1e-4:
        raise SystemExit(f"docs/results/detector_misses.json: its groups pool to a recall of {caught / pos:.6f}, its "
                         f"run's test recall is {recall:.6f}; record it again")  # fmt: skip


def _misses_findings(hops: list[dict], mistakes: list[dict]) -> str:
    """What the misses table shows, in words, from the groups whose values are defined (no NaN)."""
    known = [r for r in mistakes if r["recall"] == r["recall"]]
    parts = []
    if known:
        worst = min(known, key=lambda r: r["recall"])
        text = f"It misses most often when the mistake is \"{worst['group']}\" ({_share(worst['recall'])} caught of " \
               f"{worst['nodes']:,})"  # fmt: skip
        others = sorted({round(r["recall"], 3) for r in known if r is not worst})
        if len(others) > 1:
            text += f"; the other kinds of mistake are caught {_share(others[0])} to {_share(others[-1])} of the time"
        elif others:
            text += f"; the other kind of mistake is caught {_share(others[0])} of the time"
        parts.append(text + ".")
    lengths = [r for r in hops if r["group"].isdigit()]
    by_recall = sorted((r for r in lengths if r["recall"] == r["recall"]), key=lambda r: r["recall"])
    if len(by_recall) > 1 and round(by_recall[0]["recall"], 3) < round(by_recall[-1]["recall"], 3):
        parts.append(f"By question length, recall is lowest on {by_recall[0]['group']}-hop questions "
                     f"({_share(by_recall[0]['recall'])}) and highest on {by_recall[-1]['group']}-hop ones "
                     f"({_share(by_recall[-1]['recall'])}).")  # fmt: skip
    alarms = [r for r in lengths if r["false_alarms"] == r["false_alarms"]]
    if alarms:
        top = max(alarms, key=lambda r: r["false_alarms"])
        parts.append(f"False alarms are highest on {top['group']}-hop questions, where {_share(top['false_alarms'])} of "
                     f"the faithful answers are flagged ({_share(top['hallucinated'])} of that group's answers are "
                     "wrong).")  # fmt: skip
    return " ".join(parts)


def _misses_verified(run: dict) -> str:
    return (f"Last verified: `docs/results/detector_misses.json`, {run['date']}, commit {run.get('commit') or 'unknown'}, "
            f"seed {run['config']['seed']}, {_where(run)}; a run of the main job whose test metrics equal "
            f"`docs/results/main_job.json`'s, then `{run['misses']['command']}`.")  # fmt: skip


SGIC_SUMMARY = "outputs/sgic/test/sgic_summary.json"  # the file of docs/results/sgic.json that the tables read
SGIC_METHODS = (("baseline", "baseline (greedy, round 0)"), ("k_sampling", "k_sampling ({k} sampled answers)"),
                ("sgic", "SGIC (round 0, the documents' scores, {k} rounds)"))  # fmt: skip


def _kept(result: dict, name: str, file: str) -> dict:
    """The kept ``file`` of a result, under its name before outputs had a folder per split when recorded then."""
    files = result["files"]
    try:
        return files[file] if file in files else files[file.replace("/test/", "/")]
    except KeyError:
        raise SystemExit(
            f"docs/results/{name}.json: no {file} among its files (record it with --keep {file})"
        ) from None


def _auroc(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _run_verified(name: str, result: dict) -> str:
    steps = "; ".join(f"`{s['command']}` {_duration(s['seconds'])}" for s in result["steps"])
    return (f"Last verified from an empty cache: `docs/results/{name}.json`, {result['date']}, commit "
            f"{result.get('commit') or 'unknown'}, seed {result['config']['seed']}, {_where(result)}; {steps}.")  # fmt: skip


def sgic_table() -> str:
    """SGIC's CPU run: the methods side by side, the rounds, and what they show."""
    run = load("sgic")
    s = _kept(run, "sgic", SGIC_SUMMARY)
    k, methods = s["rounds"], s["methods"]
    lines = ["| method | EM | Hit | F1 | AUROC | prompt tokens/q | generated tokens/q | s/q |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key, label in SGIC_METHODS:
        if key in methods:
            m = methods[key]
            lines.append(f"| {label.format(k=k)} | {m['EM']:.1f} | {m['Hit']:.1f} | {m['F1']:.2f} | {_auroc(m['AUROC'])} "
                         f"| {m['prompt_tokens']:.0f} | {m['completion_tokens']:.1f} | {m['seconds']:.2f} |")  # fmt: skip
    lines += [
        "",
        "| round | Hit | F1 | mean uncertainty | AUROC | chosen as final |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in s["per_round"]:
        lines.append(f"| {r['round']} | {r['Hit']:.1f} | {r['F1']:.2f} | {r['uncertainty']:.1f} | {_auroc(r['AUROC'])} "
                     f"| {r['chosen']} |")  # fmt: skip
    return "\n".join([*lines, "", _sgic_findings(s), "", _run_verified("sgic", run)]) + "\n"


def _sgic_findings(s: dict) -> str:
    """What the SGIC tables show, in words, from the summary."""
    n, methods, rounds, t = s["questions"], s["methods"], s["per_round"], s["transitions"]
    base = methods["baseline"]
    hits = round(base["Hit"] * n / 100)
    text = (f"EM, Hit and F1 are percentages of the {n} questions; AUROC is that of the uncertainty for telling right "
            f"from wrong answers (Hit, `correct_if: hit`). {hits} of the {n} round-0 answers contain a gold answer "
            f"(Hit), and {round(base['EM'] * n / 100)} of the {n} are exact matches.")  # fmt: skip
    text += (f" From round 0 to the final answer, {t['correct => correct']} stay right, {t['incorrect => correct']} "
             f"become right, {t['correct => incorrect']} become wrong and {t['incorrect => incorrect']} stay wrong, "
             f"while the mean uncertainty goes from {rounds[0]['uncertainty']:.0f} to {rounds[-1]['uncertainty']:.0f}.")  # fmt: skip
    if "sgic" in methods and base["prompt_tokens"] and base["seconds"]:
        sg = methods["sgic"]
        text += (f" SGIC costs {sg['prompt_tokens'] / base['prompt_tokens']:.1f}x the baseline's prompt tokens and "
                 f"{sg['seconds'] / base['seconds']:.1f}x its time per question.")  # fmt: skip
    return text


UAG_FILES = ("outputs/uag/test/metrics.json", "outputs/uag/test/sweep.json", "outputs/uag/test/ltt.json")  # of uag.json
UAG_METHODS = (("uag", "UAG"), ("split_cp", "Split CP"), ("top_k", "Top-K"))


def _uag_cells(res: dict) -> list[str]:
    return ["abstain", "–"] if res["abstained"] else [f"{100 * res['ecr']:.1f}", f"{res['apss']:.1f}"]


def uag_table() -> str:
    """UAG beside split CP and Top-K over the swept levels, what the selection was, and what the table shows."""
    run = load("uag")
    metrics, sweep, ltt = (_kept(run, "uag", f) for f in UAG_FILES)
    rows = sweep["results"]
    main = ltt["main"]
    n_cal = main["n_quantile"] + main["n_calibration"] + main["n_selection"]
    fit = [st for st in run["steps"] if " fit " in st["command"]]
    scorer = ""
    if fit and "val/pair_auc" in fit[0].get("logged", {}):
        scorer = f" (validation pair AUC {fit[0]['logged']['val/pair_auc']:.2f} after fine-tuning)"
    head = (f"The relation scorer of `configs/relation_scorer.yaml`{scorer}; δ = {main['delta']:g}; "
            f"{main['grid_size']:,} configurations; calibration on {n_cal:,} {sweep['meta']['calibration_split']} "
            f"questions ({main['n_quantile']} / {main['n_calibration']} / {main['n_selection']}); "
            f"{metrics['n']:,} test questions.")  # fmt: skip
    methods = [(m, label) for m, label in UAG_METHODS if m in rows[0]]
    lines = [head, "", "| α | target | " + " | ".join(f"{label} ECR | {label} APSS" for _, label in methods) + " |",
             "|---|---|" + "---|" * (2 * len(methods))]  # fmt: skip
    for r in rows:
        cells = [c for m, _ in methods for c in _uag_cells(r[m])]
        lines.append(f"| {r['alpha']:g} | ≥ {100 * (1 - r['alpha']):.0f} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", _uag_findings(rows, metrics, ltt), "", _run_verified("uag", run)]) + "\n"


def _levels(alphas: list[float]) -> str:
    names = [f"{a:g}" for a in alphas]
    return "none" if not names else names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _uag_findings(rows: list[dict], metrics: dict, ltt: dict) -> str:
    """What the UAG table shows, in words, from the run's files."""
    certified = [r for r in rows if not r["uag"]["abstained"]]
    below = [r["alpha"] for r in certified if r["uag"]["ecr"] < 1 - r["alpha"] - 1e-12]
    abstained = [r["alpha"] for r in rows if r["uag"]["abstained"]]
    parts = [f"UAG certified {len(certified)} of the {len(rows)} levels and abstained at {_levels(abstained)}."]
    parts.append("Its coverage is at least 1 − α at every level it certified." if not below else
                 f"Its coverage is below 1 − α at {_levels(below)}, which its guarantee allows with probability "
                 "at most δ over the calibration draw.")  # fmt: skip
    both = [r for r in certified if "split_cp" in r and not r["split_cp"]["abstained"]]
    smaller = [r["alpha"] for r in both if r["uag"]["apss"] < r["split_cp"]["apss"]]
    if both:
        parts.append(f"Its sets are smaller than split CP's at {len(smaller)} of the {len(both)} levels both "
                     f"certified ({_levels(smaller)}).")  # fmt: skip
    sel = metrics["ltt"]
    if not sel["abstained"]:
        chosen = ", ".join(f"{c} α = {v['alpha']:g}" for c, v in sel["selected"].items())
        parts.append(f"At α = {metrics['alpha']:g}, Learn-Then-Test selected {chosen} (0: the component off); the "
                     f"calibration error rate was {100 * sel['calibration_error_rate']:.1f}% (p = {sel['pvalue']:.2g}), "
                     f"and {sel['num_valid']:,} of the {sel['grid_size']:,} configurations were valid.")  # fmt: skip
    on = [float(a) for a, v in ltt["evaluator"]["selected_alpha3"].items() if v]
    parts.append(f"The evaluator was kept (α3 > 0) at {_levels(sorted(on))} of the swept levels.")
    return " ".join(parts)


def _seconds(x: float) -> str:
    return f"{x:.2f} s"


def startup() -> str:
    """Each file command's start-up beside importing Lightning, this tree and the base commit (bench_startup.py)."""
    r = load("startup")
    lightning = r["imports"]["import lightning"]
    lines = [
        f"| command | seconds | share of `import lightning` | at {r['base']} |",
        "|---|---:|---:|---:|",
        f'| `python -c "import lightning"` | {_seconds(lightning)} | 100% | |',
        f'| `python -c "import torch"` | {_seconds(r["imports"]["import torch"])} | '
        f"{r['imports']['import torch'] / lightning:.0%} | |",
    ]
    lines += [f"| `{c['command']}` | {_seconds(c['seconds'])} | {c['seconds'] / lightning:.0%} | "
              f"{_seconds(c['base_seconds'])} |" for c in r["commands"]]  # fmt: skip
    worst = max(r["commands"], key=lambda c: c["seconds"])
    m = r["machine"]
    lines += ["", f"The slowest, `{worst['command']}`, takes {worst['seconds'] / lightning:.0%} of importing Lightning "
              f"(issue 58 asks for at most 15%). Medians of {r['repeats']} runs each, in one run on {m['cores']} CPU "
              f"cores ({m['cpu']}) on {r['date']}, commit {r['commit']}: `docs/results/startup.json`."]  # fmt: skip
    return "\n".join(lines) + "\n"


def startup_line() -> str:
    """One sentence of start-up times, for the README."""
    r = load("startup")
    lightning = r["imports"]["import lightning"]
    worst = max(r["commands"], key=lambda c: c["seconds"])
    return (f"The commands that work on files start in at most {_seconds(worst['seconds'])} "
            f"({worst['seconds'] / lightning:.0%} of the {_seconds(lightning)} that importing Lightning takes; "
            f"{_seconds(worst['base_seconds'])} at {r['base']}), measured on {r['date']} "
            "(`docs/results/startup.json`).\n")  # fmt: skip


def main_job_speed() -> str:
    """The main job from an empty cache beside the base commit, stage by stage (bench_main_job.py)."""
    r = load("main_job_speed")
    this, base = r["this"], r["base_run"]
    stages = list(dict.fromkeys([*base["stages"], *this["stages"]]))
    lines = [f"| | this tree | {r['base']} |", "|---|---:|---:|",
             f"| **whole run** | **{_duration(this['seconds'])}** | **{_duration(base['seconds'])}** |"]  # fmt: skip
    lines += [f"| {name} | {_duration(this['stages'].get(name, 0))} | {_duration(base['stages'].get(name, 0))} |"
              for name in stages]  # fmt: skip
    lines += [f"| epochs trained | {this['epochs']} | {base['epochs']} |"]
    lines += [f"| {k} | {this['metrics'][k]:.4f} | {base['metrics'][k]:.4f} |" for k in this["metrics"]]
    m = r["machine"]
    repeats = r.get("repeats", 1)
    how = f"the median of {repeats} runs of each, taking turns" if repeats > 1 else "one run after the other"
    lines += ["", f"This tree took {r['ratio']:.2f}x the time of {r['base']}, {how}, on {m['cores']} CPU cores "
              f"({m['cpu']}) on {r['date']}, commit {r['commit']}, each from an empty cache (all runs: "
              f"{', '.join(_duration(x) for x in this.get('all_seconds', [this['seconds']]))} against "
              f"{', '.join(_duration(x) for x in base.get('all_seconds', [base['seconds']]))}): "
              "`docs/results/main_job_speed.json`."]  # fmt: skip
    return "\n".join(lines) + "\n"


def threads() -> str:
    """Fits alone and two at once under each thread policy (bench_threads.py)."""
    r = load("threads")
    lines = [
        "| policy | one fit alone (its training) | two at once, each (training) | slowest / alone (training) |",
        "|---|---:|---:|---:|",
    ]
    for row in r["rows"]:
        train = row.get("pair_training_seconds")
        pair = [_duration(w) + (f" ({_seconds(t)})" if train else "") for w, t in zip(row["pair_seconds"], train or row["pair_seconds"])]  # fmt: skip
        alone = _duration(row["alone_seconds"]) + (f" ({_seconds(row['alone_training_seconds'])})" if train else "")
        ratio = f"{row['slowdown']:.2f}x" + (f" ({row['training_slowdown']:.2f}x)" if train else "")
        lines.append(f"| {row['policy']} | {alone} | {' and '.join(pair)} | {ratio} |")
    m = r["machine"]
    lines += ["", f"`{r['command']}`, on a warm cache, in one run on {m['cores']} CPU cores ({m['cpu']}) on "
              f"{r['date']}, commit {r['commit']}: `docs/results/threads.json`."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main_job_breakdown() -> str:
    """Where the main job's time from an empty cache went, stage by stage, in a sentence: the stages of the run that
    ``main-job-time`` reports (``record_run.py fit``, the result file ``main_job``)."""
    r = load("main_job")
    if "stages" not in r:
        raise SystemExit("docs/results/main_job.json: no stages (record it again with tools/record_run.py fit)")
    stages = sorted(r["stages"].items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{name} {_duration(seconds)}" for name, seconds in stages if seconds >= 1)
    return f"Where that run's {_duration(r['fit_seconds'])} went, stage by stage: {parts}.\n"


def serve_load() -> str:
    """``kglightning serve`` under load and in a soak, beside in-process scoring (bench_serve.py)."""
    r = load("serve_load")
    lines = ["| max_batch_size | workers | concurrency | requests/s | p50 | p99 |", "|---:|---:|---:|---:|---:|---:|"]
    for run in r["servers"]:
        lines += [f"| {run['max_batch_size']} | {run.get('workers', 1)} | {x['concurrency']} | {x['per_second']:.1f} | "
                  f"{x['p50_ms']:.0f} ms | {x['p99_ms']:.0f} ms |" for x in run["load"]]  # fmt: skip
    inproc = r["in_process"]
    m = r["machine"]
    lines += ["", f"The same {r['questions']} test questions of the embedded benchmark (graphs of a median "
              f"{r['median_triples']:.0f} triples) scored in-process, in batches of 16, took {inproc['per_second']:.1f} "
              f"questions/s."]  # fmt: skip
    predict = r.get("predict")
    if predict:
        lines[-1] += (f" Lightning's `predict` over them (read as records and their graphs built anew, their texts' "
                      f"encodings cached as the server's are) took {predict['per_second']:.1f} questions/s.")  # fmt: skip
    batched = [run for run in r["servers"] if run["max_batch_size"] > 1]
    for run in batched:
        top, one, workers = _ends(run)
        memory = f" (resident memory when ready: {run['rss_mb']:.0f} MB)" if "rss_mb" in run else ""
        lines[-1] += (f" With batching on {workers}{memory}, concurrency {top['concurrency']} "
                      f"gave {top['per_second'] / one['per_second']:.2f}x the throughput of concurrency "
                      f"{one['concurrency']}, "
                      + (f"{top['per_second'] / predict['per_second']:.0%} of `predict` and " if predict else "and ")
                      + f"{top['per_second'] / inproc['per_second']:.0%} of in-process scoring.")  # fmt: skip
    first = batched[0]
    small = first.get("small_question")
    if small:
        lines[-1] += (f" A small question (20 triples, 5 answers) at concurrency 1: p50 {small['p50_ms']:.0f} ms, "
                      f"p99 {small['p99_ms']:.0f} ms.")  # fmt: skip
    soak = first.get("soak")
    if soak:
        bad = soak["malformed_statuses"]
        four = _answered_4xx(bad)
        lines[-1] += (f" A soak of {soak['minutes']:g} minutes at concurrency {soak['concurrency']} (one worker), "
                      f"one request in 100 malformed: {sum(soak['statuses'].values()):,} requests, "
                      f"{soak['server_errors']} answered 5xx, {four} of {sum(bad.values())} malformed ones answered "
                      "4xx; the server's memory went from "
                      f"{soak['rss_mb_per_minute'][1 if len(soak['rss_mb_per_minute']) > 2 else 0]:.0f} MB after the "
                      f"first minute to {soak['rss_mb_per_minute'][-1]:.0f} MB ({_growth(soak['rss_growth'])}).")  # fmt: skip
    cpu = _serve_cpu(first, inproc, m["cores"])
    if cpu:
        lines += ["", cpu]
    lines += ["", _serve_targets(r, batched, inproc)]
    lines += ["", f"On {m['cores']} CPU cores ({m['cpu']}) on {r['date']}, commit {r['commit']}: "
              "`docs/results/serve_load.json`."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _serve_cpu(run: dict, inproc: dict, cores: int) -> str:
    """Where a request's CPU time went at a setting's highest concurrency, against in-process scoring's, and the
    throughput those cores could give at best (empty for a record without CPU readings)."""
    top, _, workers = _ends(run)
    used, alone = top.get("cpu_ms_per_request"), inproc.get("cpu_ms_per_question")
    if not used or not alone:
        return ""
    total = sum(used.values())
    return (f"Where the CPU went, at concurrency {top['concurrency']} with batching on {workers}: a request took "
            f"{used['workers']:.1f} ms of CPU in the worker, {used['http']:.1f} ms in the HTTP server and the rest of "
            f"the server (parsing, validation, LitServe's queues) and {used['client']:.1f} ms in the load generator, "
            f"{total:.1f} ms in all, where in-process scoring took {alone:.1f} ms a question. {cores} cores kept "
            f"fully busy would serve at most {1000 * cores / total:.0f} requests/s, "
            f"{1000 * cores / total / inproc['per_second']:.0%} of in-process scoring.")  # fmt: skip


def _ends(run: dict) -> tuple[dict, dict, str]:
    """A server setting's load at its highest and lowest concurrency, and its workers in words."""
    by_c = {x["concurrency"]: x for x in run["load"]}
    workers = {1: "one worker", 2: "two workers"}.get(run.get("workers", 1), f"{run.get('workers')} workers")
    return by_c[max(by_c)], by_c[min(by_c)], workers


def _answered_4xx(statuses: dict[str, int]) -> int:
    """How many of a soak's requests, counted by status code, were answered with a 4xx."""
    return sum(n for code, n in statuses.items() if code.startswith("4"))


def _serve_targets(r: dict, batched: list[dict], inproc: dict) -> str:
    """Issue 60's targets against this run, each said met or not met (so that no prose restates the numbers)."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    said = []
    for run in batched:
        top, one, workers = _ends(run)
        # the baseline is in-process `predict`; a record made before the bench ran it compares with scoring
        base, name = (r["predict"], "in-process `predict`") if "predict" in r else (inproc, "in-process scoring")
        ratio, share = top["per_second"] / one["per_second"], top["per_second"] / base["per_second"]
        said.append(f"on {workers}, concurrency {top['concurrency']} at least 3x concurrency "
                    f"{one['concurrency']} ({ratio:.2f}x: {verdict(ratio >= 3)}) and within 25% of {name} "
                    f"({share:.0%}: {verdict(share >= 0.75)})")  # fmt: skip
    small, soak = batched[0].get("small_question"), batched[0].get("soak")
    if small:
        said.append(f"a small question's p50 under 150 ms ({small['p50_ms']:.0f} ms: {verdict(small['p50_ms'] < 150)})")
    if soak:
        bad = soak["malformed_statuses"]
        four = _answered_4xx(bad)
        said.append(f"the soak with no 5xx ({soak['server_errors']}: {verdict(soak['server_errors'] == 0)}), every "
                    f"malformed request a 4xx ({verdict(four == sum(bad.values()))}) and memory growing less than "
                    f"10% ({_growth(soak['rss_growth'])}: {verdict(soak['rss_growth'] < 0.10)})")  # fmt: skip
    return "Issue 60's targets on this run: " + "; ".join(said) + "."


def serve_large() -> str:
    """``kglightning serve`` on graphs of GNN-RAG's size, beside in-process scoring (bench_serve.py --large-only)."""
    r = load("serve_large")
    large, m = r["large"], r["machine"]
    inproc = large["in_process"]
    lines = ["| workers | concurrency | requests/s | p50 | p99 | of in-process |", "|---:|---:|---:|---:|---:|---:|"]
    for run in large["servers"]:
        lines += [f"| {run['workers']} | {x['concurrency']} | {x['per_second']:.1f} | {x['p50_ms']:.0f} ms | "
                  f"{x['p99_ms']:.0f} ms | {x['per_second'] / inproc['per_second']:.0%} |" for x in run["load"]]  # fmt: skip
    lines += ["", f"{large['questions']} generated questions with graphs of a median {large['median_triples']:,.0f} "
              f"triples (at most {large['max_triples']:,}), their texts in the cache, batches of up to 16; in-process "
              f"scoring took {inproc['per_second']:.1f} questions/s. On {m['cores']} CPU cores ({m['cpu']}) on "
              f"{r['date']}, commit {r['commit']}: `docs/results/serve_large.json`."]  # fmt: skip
    return "\n".join(lines) + "\n"


def tutorial_times(page: str) -> str:
    """What each command of a tutorial page took, from ``docs/results/tutorial_<page>.json`` (``record_run.py
    tutorial``), in the page's order; a command the run left out (one on the reader's own files) says so."""
    name = "tutorial_" + Path(page).stem.replace("-", "_")
    run = load(name)
    if run["page"] != page:
        raise SystemExit(f"{page}: docs/results/{name}.json records {run['page']}")
    given = "".join(f" `{dest}` was {about}." for dest, about in run.get("files", {}).items())
    lines = [
        f"What each command took on {_cores(run['machine'])}, run one after the other as written on this page, from "
        f"an empty cache at the first, on {run['date']} (commit {run['commit']}; "
        f"`{run.get('rerun', f'python tools/record_run.py tutorial {page}')}` measures it again).{given}",
        "",
    ]
    for step in run["steps"]:
        command = step["command"].removeprefix("python -m kglightning ")
        skipped = step.get("skipped")
        if skipped:
            took = f"not run ({skipped if isinstance(skipped, str) else 'it reads your own files'})"
        else:
            took = _duration(step["seconds"])
        if "test" in step:  # a fit: what it came out with
            t = step["test"]
            took += (f"; {step['epochs']} epochs, test F1 {t['test/f1']:.3f} and AUC-PR {t['test/auc_pr']:.3f} "
                     f"(the structural baseline's F1: {t['test/structural/f1']:.3f})")  # fmt: skip
        lines.append(f"- `{command}`: {took}")
    return "\n".join(lines) + "\n"


#: blocks rendered for the page that holds them
PAGE_BLOCKS: dict[str, Callable[[str], str]] = {"tutorial-times": tutorial_times}

BLOCKS: dict[str, Callable[[], str]] = {
    "main-table": main_table,
    "misses-table": misses_table,
    "main-job-time": main_job_time,
    "test-suite": test_suite,
    "sgic-table": sgic_table,
    "uag-table": uag_table,
    "startup": startup,
    "serve-load": serve_load,
    "serve-large": serve_large,
    "startup-line": startup_line,
    "threads": threads,
    "main-job-speed": main_job_speed,
    "main-job-breakdown": main_job_breakdown,
}


def render(text: str, page: str) -> str:
    """``text`` with every block rewritten; an unknown block name is an error naming the page."""

    def one(m: re.Match) -> str:
        name = m["name"]
        if name in PAGE_BLOCKS:
            return m[1] + PAGE_BLOCKS[name](page) + m[4]
        if name not in BLOCKS:
            raise SystemExit(f"{page}: unknown numbers block {name!r} (known: {', '.join([*BLOCKS, *PAGE_BLOCKS])})")
        return m[1] + BLOCKS[name]() + m[4]

    return BLOCK.sub(one, text)


def section(text: str, heading: str, page: str) -> str:
    """The section of ``text`` that starts at the line ``heading`` and runs to the next heading of its level or
    above; an error naming the page when there is none."""
    m = re.search(rf"^{re.escape(heading)}[ \t]*$", text, flags=re.M)
    if m is None:
        raise SystemExit(f"{page}: no section {heading!r} (docs_numbers.RESULTS_SECTIONS names the ones to check)")
    level = len(heading) - len(heading.lstrip("#"))
    end = re.compile(rf"^#{{1,{level}}} ", flags=re.M).search(text, m.end())
    return text[m.start() : end.start() if end else None]


def _strip(text: str) -> str:
    """``text`` without its blocks, fenced code and inline code."""
    text = BLOCK.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def stray_numbers(text: str, page: str) -> list[str]:
    """The result-like numbers of ``text`` outside its blocks, fenced code and inline code: three decimals and
    times on the whole page (down to its history, :data:`HISTORY`), and shares and decimal table cells in its results
    sections (:data:`RESULTS_SECTIONS`)."""
    if page in HISTORY:
        m = re.search(rf"^{re.escape(HISTORY[page])}[ \t]*$", text, flags=re.M)
        if m is None:
            raise SystemExit(f"{page}: no heading {HISTORY[page]!r} above its dated records")
        text = text[: m.start()]
    results = "\n".join(_strip(section(text, h, page)) for h in RESULTS_SECTIONS.get(page, ()))
    cells = [m for line in results.splitlines() if line.lstrip().startswith("|") for m in TABLE_DECIMAL.findall(line)]
    return STRAY.findall(_strip(text)) + STRAY_SHARE.findall(results) + cells


def docstring_times(package: Path | None = None) -> list[str]:
    """The times (:data:`TIME`) written in the docstrings of ``package`` (``kglightning/``), which the API pages
    show: a measured time belongs in a result file or a dated record, which the docstring can point to. Doctest
    lines are left out."""
    import ast

    found = []
    root = package or ROOT / "kglightning"
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node, clean=False) or ""
            prose = "\n".join(line for line in doc.splitlines() if not line.lstrip().startswith((">>>", "...")))
            where = f"{path.relative_to(root.parent)}: {getattr(node, 'name', 'the module')}'s docstring"
            found += [f"{where}: {m.group()!r} (a time belongs in a result file)" for m in TIME.finditer(_strip(prose))]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which blocks differ; exit 1 if any")
    args = parser.parse_args(argv)
    stale = docstring_times()
    for page in (*PAGES, *RENDER_ONLY):
        path = ROOT / page
        text = path.read_text()
        stale += [
            f"{page}: {n!r} outside a block (a result belongs in a result file)"
            for n in (stray_numbers(text, page) if page in PAGES else [])
        ]
        new = render(text, page)
        if new == text:
            continue
        if args.check:
            pairs = zip(BLOCK.finditer(text), BLOCK.finditer(new))  # render keeps the blocks and their order
            stale += [f"{page}: block {cur['name']!r}" for old, cur in pairs if old["body"] != cur["body"]]
        else:
            path.write_text(new)
            print(f"wrote {page}")
    if stale:
        print("the pages and the result files disagree (python tools/docs_numbers.py rewrites the blocks):\n  "
              + "\n  ".join(stale))  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
