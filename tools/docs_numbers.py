"""Write the numbers of README.md and the docs from the result files the runs wrote, so each has one source.

A block of a page between ``<!-- numbers: NAME -->`` and ``<!-- numbers: end -->`` is generated: its text is what
:data:`BLOCKS` ``[NAME]`` renders from the result files in ``docs/results/`` (written by ``tools/record_run.py``).
Outside the blocks (and code), a page may not hold a number that looks like a result: three decimals or a time in
minutes and seconds (on the KG-Guard page, in its results sections, where a share such as 91.9% counts too).

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
PAGES = ("README.md", "docs/index.md", "docs/methods/kg-guard.md")
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
# numbers that only a result file may give: three decimals (a metric) or minutes and seconds (a time)
STRAY = re.compile(r"(?<![\w.])[01]\.\d{3}(?!\d)|\b\d+ min \d+ s\b")
# the part of a page the stray-number check reads (the whole page when not listed)
SECTIONS = {
    "docs/methods/kg-guard.md": ("## Results on the embedded test split", "## What the detector catches and misses"),
}
# in those sections, a share is a result too (their tables are shares)
STRAY_SHARE = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d)?%")


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


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


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
    return "\n".join([*lines, "", _findings(values), "", _verified("main_job", "detector_gat")]) + "\n"


def _findings(values: list[list[float]]) -> str:
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
    return (f"{text}. The GraphTransformer is ahead of the GAT on {wins} of {len(COLUMNS)} metrics and behind on "
            f"{losses} (the paper found it ahead).")  # fmt: skip


def main_job_time() -> str:
    """How long the README's first command took when it was last recorded."""
    main = load("main_job")
    m = main["machine"]
    text = (
        f"On {m['cores']} CPU cores ({m['cpu']}, {'GPU ' + m['gpu'] if m.get('gpu') else 'no GPU'}) the main job's "
        f"`fit` took **{_duration(main['fit_seconds'])}** "
        f"on {main['date']} from an empty cache (the benchmark, the baseline's answers and the text encodings built, "
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
    return text + " Timings on shared machines vary from hour to hour.\n"


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


BLOCKS: dict[str, Callable[[], str]] = {
    "main-table": main_table,
    "misses-table": misses_table,
    "main-job-time": main_job_time,
    "test-suite": test_suite,
}


def render(text: str, page: str) -> str:
    """``text`` with every block rewritten; an unknown block name is an error naming the page."""

    def one(m: re.Match) -> str:
        name = m["name"]
        if name not in BLOCKS:
            raise SystemExit(f"{page}: unknown numbers block {name!r} (known: {', '.join(BLOCKS)})")
        return m[1] + BLOCKS[name]() + m[4]

    return BLOCK.sub(one, text)


def stray_numbers(text: str, page: str) -> list[str]:
    """The result-like numbers of ``text`` outside its blocks, fenced code and inline code (for a page in
    :data:`SECTIONS`, in its results sections only)."""
    if page in SECTIONS:
        parts = []
        for heading in SECTIONS[page]:
            start = text.find(heading)
            if start < 0:
                raise SystemExit(f"{page}: no section {heading!r} (docs_numbers.SECTIONS names the ones to check)")
            end = text.find("\n## ", start + 1)
            parts.append(text[start : end if end > 0 else None])
        text = "\n".join(parts)
    text = BLOCK.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return STRAY.findall(text) + (STRAY_SHARE.findall(text) if page in SECTIONS else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which blocks differ; exit 1 if any")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        stale += [
            f"{page}: {n!r} outside a block (a result belongs in a result file)" for n in stray_numbers(text, page)
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
