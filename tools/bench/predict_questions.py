"""Time Lightning's ``predict`` (what ``python -m kglightning predict`` runs) over a given set of questions: the
in-process baseline that ``bench_serve.py`` sets beside the server (issue 60: "within 25% of in-process predict over
the same questions").

    python tools/bench/predict_questions.py --records DIR --checkpoint CKPT --warm-cache ~/.cache/kglightning

``DIR/test.jsonl`` holds the questions (RoG records with ``prediction``). The run happens in a temporary working
folder (so that its predictions file leaves ``outputs/`` alone) with a temporary kglightning cache holding a copy of
the warm cache's ``embeddings`` folder (the user's cache is only read): the texts are encoded already, as they are
for the server in the same benchmark, while the records are read and the graphs built anew, as the server builds
each request's. The time is that of ``trainer.predict`` alone (reading the records, building the graphs, the forward
passes, writing the predictions), not the process's start, imports or checkpoint load, which the server pays once.
Printed as one JSON line: the questions, the seconds and the questions per second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=Path, required=True, help="a folder whose test.jsonl holds the questions")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--warm-cache", type=Path, required=True, help="the cache whose text embeddings are used")
    p.add_argument("--config", default="configs/detector.yaml")
    args = p.parse_args(argv)
    records, checkpoint = args.records.resolve(), args.checkpoint.resolve()  # before the run moves to its folder
    with tempfile.TemporaryDirectory(prefix="kglightning-predict-") as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir()
        # a copy: what the run encodes anew stays in the temporary cache, not in the user's
        shutil.copytree(args.warm_cache / "embeddings", cache / "embeddings")
        os.environ["KGLIGHTNING_CACHE"] = str(cache)
        os.chdir(tmp)
        sys.path.insert(0, str(ROOT))
        import torch

        from kglightning.cli.trainer import configured

        overrides = ["--data.init_args.data_dir", str(records), "--data.init_args.proposer", "null",
                     "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]  # fmt: skip
        cli = configured("predict", args=["--config", str(ROOT / args.config), *overrides])
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        cli.model.load_state_dict(state["state_dict"])
        questions = sum(1 for line in (records / "test.jsonl").open() if line.strip())
        start = time.perf_counter()
        cli.trainer.predict(cli.model, datamodule=cli.datamodule, return_predictions=False)
        seconds = time.perf_counter() - start
    print(json.dumps({"questions": questions, "seconds": round(seconds, 2),
                      "per_second": round(questions / seconds, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
