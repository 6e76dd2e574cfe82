"""The PCST cuts' cache key at full size: the records as JSON (``to_dict``, the key before) against their
:func:`~kglightning.data.digest.records_digest` (the graphs' ids and the vocabulary once), side by side, each in a
fresh process over the same records read from the record store.

    python tools/bench/rog_generator.py --questions 1628 --triples 4150 --output /tmp/webqsp_test.jsonl
    python tools/bench/bench_digest.py --data /tmp/webqsp_test.jsonl

Prints one line per way: seconds, and the peak resident memory it added over the records (``VmHWM``, reset before the
key is computed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split(f"{field}:")[1].split()[0]) >> 10


def measure(path: str, way: str) -> dict:
    """The key of the records of ``path`` computed ``way`` (``json`` or ``digest``), in this process."""
    from kglightning.data import read_records
    from kglightning.data.digest import records_digest
    from kglightning.data.store.stage_map import fingerprint

    read_records(path, report=False)  # the first read writes the store
    records = read_records(path, report=False)  # every later run reads it
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM
    base = _status("VmRSS")
    start = time.perf_counter()
    if way == "json":
        fingerprint([r.to_dict() for r in records])
    else:
        fingerprint(records_digest(records, extra=True))
    seconds = time.perf_counter() - start
    return {"way": way, "seconds": round(seconds, 3), "added_peak_mib": _status("VmHWM") - base,
            "questions": len(records), "triples": sum(len(r.graph) for r in records)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a RoG .jsonl file")
    p.add_argument("--way", choices=("json", "digest"), help="measure one way in this process (used internally)")
    args = p.parse_args(argv)
    if args.way:
        print(json.dumps(measure(args.data, args.way)))
        return 0
    env = dict(os.environ, KGLIGHTNING_CACHE=os.environ.get("KGLIGHTNING_CACHE") or tempfile.mkdtemp())
    for way in ("json", "digest"):
        out = subprocess.run([sys.executable, __file__, "--data", args.data, "--way", way], env=env, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        print(out.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
