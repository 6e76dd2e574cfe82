"""ProxySFTDataModule: (prompt, completion) pairs from mined evidence, completion-only labels, skip counts, cache."""

from __future__ import annotations

import json

import pytest
import torch

from kglightning.datamodules.sft import IGNORE_INDEX, ProxyPrompt, ProxySFTDataModule, collate_sft, render_prompt
from kglightning.evidence import EvidenceBuilder
from kglightning.evidence.format import parse_evidence

FACTS = {  # country: (capital, currency)
    "France": ("Paris", "Euro"),
    "Japan": ("Tokyo", "Yen"),
    "Kenya": ("Nairobi", "Shilling"),
    "Peru": ("Lima", "Sol"),
}


def _records(split: str) -> list[dict]:
    out = []
    for i, (country, (capital, currency)) in enumerate(sorted(FACTS.items())):
        neighbour = sorted(FACTS)[(i + 1) % len(FACTS)]
        graph = [[country, "capital", capital], [country, "currency", currency], [capital, "city_in", country]]
        graph += [[neighbour, "capital", FACTS[neighbour][0]], [FACTS[neighbour][0], "city_in", neighbour]]
        ask_capital = (i + (split == "test")) % 2 == 0
        gold = capital if ask_capital else currency
        question = f"what is the {'capital' if ask_capital else 'currency'} of {country}?"
        out.append({"id": f"{split}-{i}", "question": question, "answer": [gold], "q_entity": [country],
                    "a_entity": [gold], "graph": graph})  # fmt: skip
    # the answer is not connected to the topic entity: no evidence
    graph = [["France", "capital", "Paris"], ["Sun", "orbited_by", "Mars"]]
    out.append({"id": f"{split}-far", "question": "which planet is red?", "answer": ["Mars"], "q_entity": ["France"],
                "a_entity": ["Mars"], "graph": graph})  # fmt: skip
    return out


@pytest.fixture
def sft_dir(tmp_path) -> str:
    root = tmp_path / "data"
    root.mkdir()
    for split in ("train", "validation", "test"):
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(split)))
    return str(root)


def _dm(model_dir, data_dir, tmp_path, **kwargs) -> ProxySFTDataModule:
    kwargs.setdefault("batch_size", 4)
    return ProxySFTDataModule(tokenizer=model_dir, data_dir=data_dir, cache_dir=str(tmp_path / "cache"), **kwargs)


def test_labels_are_ignored_exactly_on_prompt_and_padding(tiny_chat_model_dir, sft_dir, tmp_path):
    dm = _dm(tiny_chat_model_dir, sft_dir, tmp_path)
    dm.setup("fit")
    items = dm.datasets["train"]
    assert {it["task"] for it in items} == {"evidence", "qa"}
    batch = collate_sft(items[:6], pad_id=dm.tokenizer.pad_token_id)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == labels.shape == mask.shape
    assert len({len(it["input_ids"]) for it in items[:6]}) > 1  # some rows are padded
    for row, it in enumerate(items[:6]):
        n, p = len(it["input_ids"]), it["prompt_len"]
        position = torch.arange(ids.shape[1])
        expected_ignored = (position < p) | (position >= n)
        assert torch.equal(labels[row] == IGNORE_INDEX, expected_ignored)
        assert torch.equal(mask[row].bool(), position < n)
        assert torch.equal(labels[row][~expected_ignored], ids[row][~expected_ignored])
        completion = labels[row][~expected_ignored].tolist()
        assert completion[-1] == dm.tokenizer.eos_token_id
        text = dm.tokenizer.decode(completion[:-1])
        if it["task"] == "evidence":
            assert parse_evidence(text, require_confidence=True).ok, text
    # the prompt is the chat-rendered SFT instruction
    prompt = dm.tokenizer.decode(items[0]["input_ids"][: items[0]["prompt_len"]])
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "Please generate a valid relation path" in prompt
    # the batch also carries left-padded prompts of its distinct evidence questions, for generation checks
    prompts = batch["prompt"]
    assert prompts["input_ids"].shape[0] == len({it["id"] for it in items[:6] if it["task"] == "evidence"})
    assert bool((prompts["attention_mask"][:, -1] == 1).all())


def test_records_without_evidence_are_skipped_and_counted(tiny_chat_model_dir, sft_dir, tmp_path):
    dm = _dm(tiny_chat_model_dir, sft_dir, tmp_path)
    with pytest.warns(UserWarning, match="skipped 1 of 5 records without evidence"):
        dm.setup("fit")
    stats = dm.stats["train"]
    assert stats.records == 5 and stats.without_evidence == ["train-far"]
    assert stats.qa_examples == 4 and stats.evidence_examples >= 4
    assert {it["id"] for it in dm.datasets["train"]} == {f"train-{i}" for i in range(4)}
    # predict serves every question, with or without evidence, left-padded
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()))
    assert batch["id"] == ["test-0", "test-1", "test-2", "test-3"]
    assert bool((batch["attention_mask"][:, -1] == 1).all())
    assert sum(len(b["id"]) for b in dm.predict_dataloader()) == 5


def test_options_change_the_examples(tiny_chat_model_dir, sft_dir, tmp_path):
    dm = _dm(tiny_chat_model_dir, sft_dir, tmp_path, max_evidence=1, qa_task=False, prompt_format=ProxyPrompt("plain"))
    dm.setup("fit")
    assert dm.stats["train"].qa_examples == 0
    assert dm.stats["train"].evidence_examples == 4  # one per question with evidence
    first = dm.datasets["train"][0]
    assert dm.tokenizer.decode(first["input_ids"][: first["prompt_len"]]).startswith("Please generate")
    full = _dm(tiny_chat_model_dir, sft_dir, tmp_path)
    full.setup("validate")
    lengths = sorted(len(it["input_ids"]) for it in full.datasets["validation"])
    limit = lengths[len(lengths) // 2]
    short = _dm(tiny_chat_model_dir, sft_dir, tmp_path, max_length=limit)
    short.setup("validate")
    assert short.stats["validation"].too_long == sum(n > limit for n in lengths) > 0
    assert len(short.datasets["validation"]) == sum(n <= limit for n in lengths)
    after = _dm(tiny_chat_model_dir, sft_dir, tmp_path, max_evidence=1, qa_task=False, confidence_position="after")
    after.setup("fit")
    item = after.datasets["train"][0]
    target = after.tokenizer.decode(item["input_ids"][item["prompt_len"] :], skip_special_tokens=True)
    (z,) = parse_evidence(target, require_confidence=True).evidence
    assert target.startswith("<PATH>") and "</PATH> <CONFIDENCE>" in target and 0 <= z.confidence <= 1
    with pytest.raises(ValueError, match="confidence_position"):
        _dm(tiny_chat_model_dir, sft_dir, tmp_path, confidence_position="before")


def test_render_prompt_system_turn(tiny_chat_model_dir):
    from kglightning.datamodules.sft import sft_tokenizer

    tok = sft_tokenizer(tiny_chat_model_dir)
    text = render_prompt(tok, "hi", "chat", system_prompt="be brief")
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    assert render_prompt(tok, "hi", "plain") == "hi\n"


def test_mined_evidence_is_cached_per_builder_config(tiny_chat_model_dir, sft_dir, tmp_path, monkeypatch):
    dm = _dm(tiny_chat_model_dir, sft_dir, tmp_path)
    rows = dm.rows("train")
    assert dm.cache_path("train").exists()

    def boom(*args, **kwargs):
        raise AssertionError("mined again")

    monkeypatch.setattr(EvidenceBuilder, "mine", boom)
    assert _dm(tiny_chat_model_dir, sft_dir, tmp_path).rows("train") == rows
    other = _dm(tiny_chat_model_dir, sft_dir, tmp_path, builder=EvidenceBuilder(max_hops=1))
    assert other.cache_path("train") != dm.cache_path("train")
    with pytest.raises(AssertionError, match="mined again"):
        other.rows("train")
    assert _dm(tiny_chat_model_dir, sft_dir, tmp_path, max_records=2).cache_path("train") != dm.cache_path("train")


@pytest.mark.parametrize(
    "change",
    [{"max_hops": 2}, {"alpha": 0.3}, {"beta": 0.7}, {"max_constraints": 1}, {"max_paths": 10},
     {"skip_cvt_constraints": False}, {"answer_constraints": True}],
)  # fmt: skip
def test_every_mining_setting_is_in_the_cache_key(tiny_chat_model_dir, sft_dir, tmp_path, change):
    base = _dm(tiny_chat_model_dir, sft_dir, tmp_path).cache_path("train")
    assert _dm(tiny_chat_model_dir, sft_dir, tmp_path, builder=EvidenceBuilder(**change)).cache_path("train") != base
    assert set(change) <= set(vars(EvidenceBuilder()))  # the settings the key reads are the builder's own


def test_qa_paths_and_the_data_file_are_in_the_cache_key(tiny_chat_model_dir, sft_dir, tmp_path):
    import os

    base = _dm(tiny_chat_model_dir, sft_dir, tmp_path).cache_path("train")
    assert _dm(tiny_chat_model_dir, sft_dir, tmp_path, qa_max_paths=2).cache_path("train") != base
    train = os.path.join(sft_dir, "train.jsonl")
    with open(train, "a") as f:
        f.write("\n")  # the data file changed (size and time)
    assert _dm(tiny_chat_model_dir, sft_dir, tmp_path).cache_path("train") != base


def test_mining_on_forked_processes_caches_the_rows_of_one_process(tiny_chat_model_dir, sft_dir, tmp_path, monkeypatch):
    import os

    import kglightning.datamodules.sft as sft
    import kglightning.datamodules.sft_examples as sft_examples

    pids = tmp_path / "pids.txt"
    real = sft_examples.mine_row

    def mine_and_note(*args, **kwargs):
        with pids.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "mine_row", mine_and_note)
    monkeypatch.setattr(sft, "MINE_CHUNK", 2)
    one = ProxySFTDataModule(tokenizer=tiny_chat_model_dir, data_dir=sft_dir, cache_dir=str(tmp_path / "a"))
    many = ProxySFTDataModule(
        tokenizer=tiny_chat_model_dir, data_dir=sft_dir, cache_dir=str(tmp_path / "b"), mine_workers=2
    )
    rows = one.rows("train")
    pids.unlink()
    assert len(rows) > 2 and many.rows("train") == rows
    seen = set(pids.read_text().split())
    assert str(os.getpid()) not in seen and len(seen) >= 1  # mined in the children
    assert list(many.cache_path("train").glob("piece-*.arrow"))  # kept as Arrow files, read back unmined:
    monkeypatch.setattr(sft, "mine_row", lambda *args, **kwargs: pytest.fail("mined again"))
    monkeypatch.setattr(ProxySFTDataModule, "read_split", lambda *args, **kwargs: pytest.fail("records read"))
    for cache in ("a", "b"):
        again = ProxySFTDataModule(tokenizer=tiny_chat_model_dir, data_dir=sft_dir, cache_dir=str(tmp_path / cache))
        assert again.rows("train") == rows
    with pytest.raises(ValueError, match="mine_workers"):
        ProxySFTDataModule(tokenizer=tiny_chat_model_dir, data_dir=sft_dir, mine_workers=0)
