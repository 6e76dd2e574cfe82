"""KFold: the split of pooled questions into folds, and its checks."""

from __future__ import annotations

import pytest

from kglightning.data.folds import KFold

POOL = {"train": [f"t{i}" for i in range(30)], "validation": [f"v{i}" for i in range(7)], "test": ["x1", "x2"]}


def _every(ids_by_split):
    return sorted(q for ids in ids_by_split.values() for q in ids)


@pytest.mark.parametrize("k", [2, 3, 5, 39])
def test_every_fold_is_disjoint_and_covering_and_the_test_folds_cover_the_pool_once(k):
    tests = []
    for fold in range(k):
        parts = KFold(k=k, fold=fold, seed=3, validation_fraction=0.25).assign(POOL)
        assert set(parts) == {"train", "validation", "test"}
        assert _every(parts) == _every(POOL)  # each question in exactly one of the three
        assert parts["train"] and parts["validation"] and parts["test"]
        rest = len(parts["train"]) + len(parts["validation"])
        assert len(parts["validation"]) == max(1, int(0.25 * rest + 0.5))  # rounded half up
        tests.append(parts["test"])
    sizes = [len(t) for t in tests]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 39
    assert sorted(q for t in tests for q in t) == _every(POOL)


def test_the_assignment_is_seeded_and_does_not_depend_on_the_files_order():
    a = KFold(k=4, fold=1, seed=0).assign(POOL)
    assert a == KFold(k=4, fold=1, seed=0).assign(POOL)
    shuffled = {split: list(reversed(ids)) for split, ids in POOL.items()}
    assert {s: sorted(v) for s, v in KFold(k=4, fold=1, seed=0).assign(shuffled).items()} == {
        s: sorted(v) for s, v in a.items()
    }
    assert a["test"] != KFold(k=4, fold=1, seed=1).assign(POOL)["test"]
    # the pooled order is kept within each split
    assert a["train"] == [q for split in POOL for q in POOL[split] if q in set(a["train"])]


def test_only_the_pool_is_folded():
    folds = KFold(k=3, fold=0, pool=["train", "validation"])
    parts = folds.assign({"train": POOL["train"], "validation": POOL["validation"]})
    assert _every(parts) == sorted(POOL["train"] + POOL["validation"])
    with pytest.raises(ValueError, match=r"the pool names \['validation'\]"):
        folds.assign({"train": POOL["train"]})


def test_an_id_in_two_pooled_splits_names_both_files():
    ids = {"train": ["a", "b", "c", "d"], "validation": ["e"], "test": ["f", "b"]}
    sources = {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "test": "data/test.jsonl"}
    with pytest.raises(ValueError, match=r"'b' is in two pooled splits: train \(data/train.jsonl\) and test "
                       r"\(data/test.jsonl\)"):  # fmt: skip
        KFold(k=2).assign(ids, sources)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 1}, "k must be an integer of at least 2"),
        ({"k": 3, "fold": 3}, r"fold must be an integer in \[0, 2\]"),
        ({"fold": -1}, "fold must be an integer"),
        ({"validation_fraction": 0.0}, "strictly between 0 and 1"),
        ({"validation_fraction": 1.0}, "strictly between 0 and 1"),
        ({"pool": ["train", "dev"]}, "pool must name some of"),
        ({"pool": []}, "pool must name some of"),
        ({"pool": ["train", "train"]}, "names a split twice"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KFold(**kwargs)


def test_too_few_questions_are_refused():
    with pytest.raises(ValueError, match="3 pooled questions cannot make 5 folds"):
        KFold(k=5, pool=["train"]).assign({"train": ["a", "b", "c"]})
    with pytest.raises(ValueError, match="too few for a training and a validation split"):
        KFold(k=2, pool=["train"]).assign({"train": ["a", "b", "c"]})  # 1 question beside the test fold


def test_the_cache_key_names_every_setting():
    base = KFold()
    keys = {
        base.cache_key,
        KFold(k=4).cache_key,
        KFold(fold=1).cache_key,
        KFold(seed=1).cache_key,
        KFold(validation_fraction=0.3).cache_key,
        KFold(pool=["train", "validation"]).cache_key,
    }
    assert len(keys) == 6
    assert KFold().cache_key == base.cache_key
    assert "fold 0/5" in base.describe({"train": 8, "validation": 2, "test": 3})
