"""``python _detector_ddp_unlabelled.py ROOT ENCODER``: fit and test the detector on 2 CPU processes where one rank's
validation and test shards hold only a question without a gold answer (its answers are unlabelled). Prints the
test F1 of each rank; a rank that skipped the loss's collective used to hang both."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import lightning as L

from kglightning.data import SentenceEncoder
from kglightning.datamodules import DetectionDataModule
from kglightning.modules import HallucinationDetector
from kglightning.nn import GraphTransformerEncoder


def main(root: Path, encoder: str) -> None:
    data = root / "data"
    graph = [["France", "capital", "Paris"], ["Paris", "river", "Seine"], ["France", "river", "Loire"],
             ["France", "borders", "Spain"]]  # fmt: skip
    row = {"question": "capital of France?", "answer": ["Paris"], "q_entity": ["France"], "a_entity": ["Paris"],
           "graph": graph}  # fmt: skip
    blank = {**row, "answer": [], "a_entity": []}
    splits = {
        "train": [{**row, "id": "t0", "prediction": ["Paris", "Seine"]}, {**row, "id": "t1", "prediction": ["Loire"]}],
        "validation": [{**row, "id": "v0", "prediction": ["Paris", "Loire"]}, {**blank, "id": "v1", "prediction": ["Seine"]}],
        "test": [{**row, "id": "s0", "prediction": ["Paris", "Seine"]}, {**blank, "id": "s1", "prediction": ["Spain"]}],
    }  # fmt: skip
    data.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():  # both ranks write the same bytes
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    L.seed_everything(0)
    dm = DetectionDataModule(data_dir=str(data), encoder=SentenceEncoder(encoder, show_progress=False),
                             cache_dir=str(root / "cache"), batch_size=1)  # fmt: skip
    model = HallucinationDetector(text_dim=32, encoder=partial(GraphTransformerEncoder, hidden_channels=16, heads=4))
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=1, num_sanity_val_steps=0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=str(root))  # fmt: skip
    trainer.fit(model, dm)
    (result,) = trainer.test(model, dm, verbose=False)
    print(f"rank {trainer.global_rank}: test f1 {result['test/f1']}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
