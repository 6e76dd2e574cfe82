"""UAG: scores, the traversal against the grid, the LTT controller, the baselines and the LLM evaluator."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from kglightning.conformal.functional import conformal_quantile
from kglightning.conformal.uag import (
    QuestionScores,
    SplitCP,
    TopK,
    UAGController,
    UAGTraversal,
    alpha_grid,
    candidate_scores,
    component_thresholds,
    covers,
    grid_membership,
    grid_outcomes,
    members_at,
    paper_alpha_grid,
    score_question,
    score_questions,
)
from kglightning.conformal.uag.controller import split_indices
from kglightning.conformal.uag.evaluator import LLMEvaluator
from kglightning.data.embeddings import EmbeddingCache
from kglightning.data.records import KGQARecord
from kglightning.data.sources.embedded import build_embedded_benchmark
from kglightning.data.sources.loaders import read_records
from kglightning.llm.backends.base import Generation, LLMBackend

INF = float("inf")


class HashEncoder:
    """Deterministic unit vectors from a hash of the text: a stand-in text encoder with real geometry."""

    dim, cache_key = 16, "hash16"

    def encode(self, texts):
        out = []
        for t in texts:
            seed = int(hashlib.sha1(t.encode()).hexdigest()[:8], 16)
            v = torch.randn(self.dim, generator=torch.Generator().manual_seed(seed))
            out.append(v / v.norm())
        return torch.stack(out) if out else torch.zeros(0, self.dim)


@pytest.fixture
def cache():
    return EmbeddingCache(HashEncoder(), root=None)


def _record(**kw) -> KGQARecord:
    base = {
        "id": "q1",
        "question": "which currency is used in the country whose capital is Paris?",
        "answer": ["Euro"],
        "q_entity": ["Paris"],
        "a_entity": ["Euro"],
        "graph": [
            ["France", "capital", "Paris"],
            ["France", "currency", "Euro"],
            ["France", "language", "French"],
            ["Germany", "currency", "Euro"],
            ["Germany", "capital", "Berlin"],
            ["Paris", "river", "Seine"],
            ["Seine", "mouth", "English Channel"],
        ],
    }
    base.update(kw)
    return KGQARecord.from_dict(base)


@pytest.fixture(scope="module")
def embedded_records(tmp_path_factory):
    paths = build_embedded_benchmark(tmp_path_factory.mktemp("bench"), seed=0)
    return list(read_records(paths["validation"], split="validation", limit=60))


def test_scores_of_a_hand_made_question(cache):
    rec = _record()
    s = score_question(rec, cache, max_hops=3)
    assert s.entities == sorted({"France", "Euro", "French", "Germany", "Seine", "English Channel"})  # Berlin: 4 hops
    assert ("~capital",) in s.paths and ("~capital", "currency") in s.paths
    i1, i2 = s.paths.index(("~capital",)), s.paths.index(("~capital", "currency"))
    assert s.expand[i1] == -INF  # a 1-hop path needs no Eq. 4 step
    q = "which currency is used in the country whose capital is Paris?"
    e = cache.embed([q, "inverse of capital", q, "inverse of capital -> currency"])
    assert s.expand[i2].item() == pytest.approx(1 - float(e[0] @ e[1]), abs=1e-6)  # its first hop, from Q
    i3 = s.paths.index(("~capital", "currency", "~currency"))
    step2 = 1 - float(cache.embed([q + " | inverse of capital"])[0] @ cache.embed(["currency"])[0])
    assert s.expand[i3].item() == pytest.approx(max(s.expand[i2].item(), step2), abs=1e-6)
    assert s.path_score[i2].item() == pytest.approx(1 - float(e[2] @ e[3]), abs=1e-6)
    euro = s.entities.index("Euro")
    assert s.gold.tolist() == [name == "Euro" for name in s.entities] and s.n_gold == 1
    # without an LLM the evaluator compares the candidate with the question
    assert s.evaluator[euro].item() == pytest.approx(1 - float(cache.embed(["Euro"])[0] @ e[2]), abs=1e-6)
    # the component scores are the smallest scores that keep the gold answer
    comp = s.component_scores()
    reach = [
        i for i, p in enumerate(s.paths) if "Euro" in {s.entities[e] for pi, e in s.incidence.T.tolist() if pi == i}
    ]
    assert comp[0].item() == pytest.approx(min(s.expand[i].item() for i in reach))
    assert comp[1].item() == pytest.approx(min(s.path_score[i].item() for i in reach))
    assert comp[2].item() == pytest.approx(s.evaluator[euro].item())


def test_unreachable_gold_gives_infinite_component_scores(cache):
    s = score_question(_record(a_entity=["Tokyo"], answer=["Tokyo"]), cache)
    assert torch.isinf(s.component_scores()).all()
    s = score_question(_record(a_entity=["Euro", "Tokyo"]), cache)
    assert torch.isfinite(s.component_scores("any")).all() and torch.isinf(s.component_scores("all")).all()
    assert score_question(_record(q_entity=["Atlantis"]), cache).entities == []


@pytest.mark.heavy
def test_traversal_gives_the_grid_sets(cache, embedded_records):
    scores = score_questions(embedded_records, cache, max_hops=3, progress=False)
    trav = UAGTraversal(cache, max_hops=3)
    for rec, s in zip(embedded_records[:25], scores):
        pooled = torch.cat([s.expand[torch.isfinite(s.expand)], s.path_score, s.evaluator])
        qs = torch.quantile(pooled, torch.tensor([0.2, 0.5, 0.8])).tolist() + [INF] if pooled.numel() else [INF]
        t = torch.tensor(qs)
        grid = grid_membership(s, t, t, t)
        for i, a in enumerate(qs):
            for j, b in enumerate(qs):
                for k, c in enumerate(qs):
                    res = trav.run(rec, a, b, c)
                    want = {s.entities[e] for e in grid[:, i, j, k].nonzero().flatten().tolist()}
                    assert set(res.answers) == want, (rec.id, a, b, c)
                    assert members_at(s, a, b, c).tolist() == grid[:, i, j, k].tolist()
        # thresholds at +inf give the whole pool; tight ones prune the search
        full = trav.run(rec, INF, INF, INF)
        assert full.answers and set(full.answers) == set(s.entities) or not s.entities
        tight = trav.run(rec, -1.0, INF, INF)
        assert tight.expanded <= 1 and set(tight.answers) <= {
            s.entities[e] for pi, e in s.incidence.T.tolist() if len(s.paths[pi]) == 1
        }


@pytest.mark.heavy
def test_grid_outcomes_match_per_configuration_sets(cache, embedded_records):
    scores = score_questions(embedded_records[:20], cache, max_hops=2, progress=False)
    t1, t2, t3 = torch.tensor([0.5, INF]), torch.tensor([0.8, 1.0, INF]), torch.tensor([0.9, INF])
    for mode in ("any", "all"):
        covered, sizes = grid_outcomes(scores, t1, t2, t3, mode)
        for n, s in enumerate(scores):
            for i in range(2):
                for j in range(3):
                    for k in range(2):
                        m = members_at(s, float(t1[i]), float(t2[j]), float(t3[k]))
                        row = (i * 3 + j) * 2 + k
                        assert sizes[row, n] == int(m.sum()) and covered[row, n] == covers(s, m, mode)


def test_alpha_grid_and_thresholds():
    assert alpha_grid(0.1).tolist() == [round(0.1 * i, 10) for i in range(10)]
    assert alpha_grid(0.3).tolist() == [0.0, 0.3, 0.6, 0.9]
    cal = torch.tensor([0.1, 0.5, 0.2, 0.9, INF, 0.3, 0.4, 0.7, 0.6])
    alphas = torch.tensor([0.0, 0.2, 0.5, 0.05])
    th = component_thresholds(cal, alphas)
    assert th[0] == INF and th[3] == INF  # alpha 0 disables the component; n too small gives +inf
    assert th[1] == conformal_quantile(cal, 0.2) and th[2] == conformal_quantile(cal, 0.5)
    parts = split_indices(10, (0.3, 0.3, 0.4), seed=1)
    assert sorted(torch.cat(parts).tolist()) == list(range(10)) and [len(p) for p in parts] == [3, 3, 4]
    with pytest.raises(ValueError, match="split_fractions"):
        split_indices(10, (0.5, 0.6, 0.1), seed=0)


def _synthetic(n: int, seed: int, miss: float = 0.05) -> list[QuestionScores]:
    """Questions with 30 candidates on 1- and 2-hop paths; the gold one tends to score lower, some are missing."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for q in range(n):
        A = 30
        expand = torch.cat([torch.full((A // 2,), -INF), torch.rand(A - A // 2, generator=g)])
        path_score = torch.rand(A, generator=g)
        evaluator = torch.rand(A, generator=g)
        gold = torch.zeros(A, dtype=torch.bool)
        if torch.rand(1, generator=g).item() > miss:
            j = int(torch.randint(A, (1,), generator=g))
            gold[j] = True
            path_score[j] *= 0.5
            evaluator[j] *= 0.6
        out.append(
            QuestionScores(
                f"s{q}",
                [f"e{i}" for i in range(A)],
                [(f"r{i}",) for i in range(A)],
                expand,
                path_score,
                torch.stack([torch.arange(A), torch.arange(A)]),
                evaluator,
                gold,
                1,
            )
        )
    return out


def test_controller_selects_the_smallest_valid_configuration():
    pool = _synthetic(600, seed=0)
    ctl = UAGController(grid_step=0.25, delta=0.1, seed=0).fit(pool)
    assert ctl.order[0] == 0  # the full pool is tested first
    cal = ctl.select(0.3)
    assert not cal.abstained and cal.valid[cal.index]
    sizes = torch.where(cal.valid, cal.sel_size, torch.full_like(cal.sel_size, INF))
    assert cal.sel_size[cal.index] == sizes.min()
    assert cal.summary()["calibration_error_rate"] <= 0.3
    a1, a2, a3 = cal.selected_alphas
    assert {a1, a2, a3} <= {0.0, 0.25, 0.5, 0.75}
    assert cal.selected_thresholds[2] == (
        INF if a3 == 0 else float(ctl.thresholds[2][[0.0, 0.25, 0.5, 0.75].index(a3)])
    )
    # 5% of questions have no gold candidate: alpha below that cannot be certified, and the controller says so
    low = ctl.select(0.02)
    assert low.abstained and low.selected_alphas is None and low.selected_thresholds == (INF, INF, INF)
    assert low.summary()["abstained"] is True and "selected" not in low.summary()


@pytest.mark.heavy
def test_uag_coverage_holds_over_random_splits():
    data = _synthetic(1500, seed=1)
    alpha, trials, low = 0.25, 25, 0
    for t in range(trials):
        perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(100 + t)).tolist()
        pool, test = [data[i] for i in perm[:600]], [data[i] for i in perm[600:]]
        cal = UAGController(grid_step=0.25, delta=0.1, seed=t).fit(pool).select(alpha)
        ecr = sum(covers(s, members_at(s, *cal.selected_thresholds)) for s in test) / len(test)
        low += ecr < 1 - alpha - 0.03  # 0.03 = 2 s.d. of a 900-question ECR
    assert low <= 0.1 * trials + 2  # LTT: P(risk > alpha) <= delta


@pytest.mark.heavy
def test_paper_grid_keeps_every_component_on_and_still_covers():
    assert paper_alpha_grid(0.3).tolist() == [0.3, 0.6, 0.9] and paper_alpha_grid(0.1).tolist()[-1] == 1.0
    th = component_thresholds(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 1.0]))
    assert th[1] == -INF  # alpha 1 admits nothing
    with pytest.raises(ValueError, match="grid must be"):
        UAGController(grid="none")
    data = _synthetic(1500, seed=4)
    alpha, trials, low = 0.3, 15, 0
    for t in range(trials):
        perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(200 + t)).tolist()
        pool, test = [data[i] for i in perm[:600]], [data[i] for i in perm[600:]]
        ctl = UAGController(grid_step=(0.3, 0.3, 0.1), grid="paper", delta=0.1, seed=t).fit(pool)
        assert [len(a) for a in ctl.alphas] == [3, 3, 10] and all(float(a.min()) > 0 for a in ctl.alphas)
        cal = ctl.select(alpha)
        if cal.abstained:
            continue
        assert min(cal.selected_alphas) > 0 and all(q < INF for q in cal.selected_thresholds[:2])
        ecr = sum(covers(s, members_at(s, *cal.selected_thresholds)) for s in test) / len(test)
        low += ecr < 1 - alpha - 0.03
    assert low <= 0.1 * trials + 2


def test_evaluator_usage_counts_levels_that_keep_alpha3():
    from kglightning.pipelines.uag import evaluator_usage

    ctl = UAGController(grid_step=0.25, delta=0.1, seed=0).fit(_synthetic(600, seed=0))
    sel = {a: ctl.select(a) for a in (0.02, 0.3, 0.5)}
    use = evaluator_usage(sel)
    assert use["levels"] == 3 and use["certified"] == 2 and use["selected_alpha3"]["0.02"] is None
    kept = [a for a in (0.3, 0.5) if sel[a].selected_alphas[2] > 0]
    assert use["alpha3_positive"] == len(kept) == use["filtering"]


@pytest.mark.heavy
def test_split_cp_and_top_k():
    pool, test = _synthetic(800, seed=2), _synthetic(2000, seed=3)
    cp = SplitCP().fit(pool, 0.2)
    cal = torch.tensor([float(candidate_scores(s)[s.gold].min()) if s.gold.any() else INF for s in pool])
    assert cp.qhat == float(conformal_quantile(cal, 0.2)) and not cp.abstained
    ecr = sum(covers(s, cp.member(s)) for s in test) / len(test)
    assert ecr >= 0.8 - 0.03
    assert SplitCP().fit(pool, 0.01).abstained  # 5% missing: +inf threshold, full sets, flagged
    tk = TopK().fit(pool, 0.2)
    cov_k = [sum(covers(s, tk.member(s)) for s in pool) / len(pool) for _ in [0]][0]
    assert cov_k >= 0.8 and tk.k >= 1
    tk.k -= 1
    assert sum(covers(s, tk.member(s)) for s in pool) / len(pool) < 0.8  # the smallest such K
    assert TopK().fit(pool, 0.01).abstained


class Scripted(LLMBackend):
    def __init__(self, answers):
        super().__init__()
        self.answers, self.prompts = list(answers), []

    @property
    def name(self):
        return "scripted"

    def _generate_uncached(self, batch, params, on_result):
        for i, messages in enumerate(batch):
            self.prompts.append(messages[-1]["content"])
            on_result(i, Generation(text=self.answers.pop(0), prompt_tokens=1, completion_tokens=1))


def test_llm_evaluator_prompts_and_rescoring(cache):
    recs = [_record(), _record(id="q2")]
    scores = score_questions(recs, cache, progress=False)
    ev = LLMEvaluator(Scripted(["Answer: Euro\n", "  \n"]), max_paths=3)
    ev.rescore(recs, scores, cache)
    prompt = ev.backend.prompts[0]
    assert prompt.startswith("Based on the following reasoning paths: Paris <- capital <- France")
    assert prompt.endswith(", which currency is used in the country whose capital is Paris?")
    euro = scores[0].entities.index("Euro")
    assert scores[0].llm_answer == "Euro" and scores[0].evaluator[euro].item() == pytest.approx(0.0, abs=1e-3)
    # a blank answer is counted and the evaluator falls back to the question
    assert ev.num_no_answer == 1 and scores[1].llm_answer is None
    assert torch.equal(scores[1].evaluator, score_question(recs[1], cache).evaluator)
    t = UAGTraversal(cache).run(recs[0], INF, INF, 0.01, llm_answer="Euro")
    assert t.answers == ["Euro"]


class BatchDependentEncoder(HashEncoder):
    """A text's vector moves a little with the size of the batch it is encoded in, as a padded transformer batch
    moves it in the last digits: two encodings of one text agree only if their batches did."""

    def encode(self, texts):
        out = super().encode(texts)
        if not len(out):
            return out
        out = out + 1e-3 * len(texts) * torch.ones(self.dim)
        return out / out.norm(dim=1, keepdim=True)


@pytest.mark.heavy
def test_texts_of_one_question_are_not_stored_and_paths_are_label_ids(tmp_path, embedded_records):
    from kglightning.conformal.uag.scores import _scratch_texts, _texts, _walks
    from kglightning.data.kg import KGIndex
    from kglightning.data.text import path_text

    recs = embedded_records[:12]
    cache = EmbeddingCache(HashEncoder(), root=tmp_path)
    scores = score_questions(recs, cache, max_hops=3, progress=False, chunk_size=5)
    walks = [_walks(r, KGIndex.from_record(r), 3, 5000) for r in recs]
    scratch = set().union(*(_scratch_texts(r, w) for r, w in zip(recs, walks)))
    kept = set().union(*(_texts(r, w, None) for r, w in zip(recs, walks)))  # a 1-hop path's text is its relation's
    own = scratch - kept
    assert len({path_text(p) for w in walks for p in w} - kept) > 100 and own
    assert own and not own & set(EmbeddingCache(HashEncoder(), root=tmp_path)._index)  # not on disk
    assert not own & set(cache._index)
    table = scores[0].paths.table
    assert all(s.paths.table is table for s in scores)
    assert len(table) < 100 < sum(len(s.paths) for s in scores)  # labels are few; paths many
    for s, w in zip(scores, walks):
        assert s.incidence.dtype == torch.int16 and s.paths.rows.dtype == np.int16
        assert list(s.paths) == list(w) and s.paths[1:3] == list(w)[1:3]
    # the same scores as one question at a time
    for r, s in zip(recs, scores):
        one = score_question(r, EmbeddingCache(HashEncoder(), root=None), max_hops=3)
        assert one.paths == s.paths and one.entities == s.entities
        assert torch.equal(one.incidence, s.incidence) and torch.equal(one.path_score, s.path_score)
        assert torch.equal(one.expand, s.expand) and torch.equal(one.evaluator, s.evaluator)


@pytest.mark.heavy
def test_traversal_reads_the_step_rows_the_grid_read(embedded_records):
    from kglightning.data.embeddings import TransientEmbeddings

    cache = EmbeddingCache(BatchDependentEncoder(), root=None)
    recs = embedded_records[:15]
    scratches = [TransientEmbeddings(cache) for _ in recs]
    scores = score_questions(recs, cache, max_hops=3, progress=False, scratches=scratches)
    assert all(len(x) for x in scratches) and not any(" | " in t or " -> " in t for t in cache._index)
    trav, checked = UAGTraversal(cache, max_hops=3), 0
    for rec, s, scratch in zip(recs, scores, scratches):
        finite = s.expand[torch.isfinite(s.expand)]
        for q1 in finite.unique().tolist()[:4]:  # a threshold exactly at a score: any drift in a row flips it
            want = {s.entities[e] for e in members_at(s, q1, INF, INF).nonzero().flatten().tolist()}
            assert set(trav.run(rec, q1, INF, INF, scratch=scratch).answers) == want, (rec.id, q1)
            checked += 1
    assert checked > 10


@pytest.mark.heavy
def test_a_question_scores_the_same_in_any_chunk_and_stored_texts_serve_reruns(tmp_path, embedded_records):
    recs = embedded_records[:12]
    shared = EmbeddingCache(BatchDependentEncoder(), None)
    score_questions(recs, shared, progress=False)  # the shared texts (questions, relations, names) now cached
    n_shared = len(shared)
    alone = [score_questions([r], shared, progress=False)[0] for r in recs]
    for chunk in (5, 12):  # with the same cache, a question's own texts give the same rows in any chunk
        together = score_questions(recs, shared, progress=False, chunk_size=chunk)
        for a, b in zip(alone, together):
            assert torch.equal(a.expand, b.expand) and torch.equal(a.path_score, b.path_score), chunk
    assert len(shared) == n_shared  # and none of them was stored
    cache = EmbeddingCache(BatchDependentEncoder(), tmp_path)
    stored = score_questions(recs, cache, progress=False, store_question_texts=True)
    assert any(" -> " in t for t in cache._index)
    rerun = EmbeddingCache(BatchDependentEncoder(), tmp_path)
    before = len(rerun)
    again = score_questions(recs, rerun, progress=False, store_question_texts=True)
    assert len(rerun) == before  # nothing encoded
    assert all(
        torch.equal(a.path_score, b.path_score) and torch.equal(a.expand, b.expand) for a, b in zip(stored, again)
    )
    with pytest.raises(ValueError, match="got 1 scratches for 12 records"):
        score_questions(recs, cache, progress=False, scratches=[None])
