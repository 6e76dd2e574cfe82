"""LightningDataModule for hallucination detection: one augmented graph per question with proposed answers."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch_geometric.data import Batch, Data

from kglightning.data.digest import records_digest
from kglightning.data.embeddings import EmbeddingCache, RequestEmbeddings, SentenceEncoder, TextView
from kglightning.data.proposer import AnswerNodeScorer, AnswerProposer, load_proposals, save_proposals
from kglightning.data.records import VALIDATION_VERSION, KGQARecord, RecordError
from kglightning.data.store.cache import folder_name
from kglightning.data.store.cache_marks import set_aside
from kglightning.data.store.stage_map import cached_map, fingerprint, stored_map
from kglightning.data.text import RELATION_VIEWS, RelationView
from kglightning.datamodules.base import KGQADataModule
from kglightning.datamodules.detection_graphs import DetectionStats, answer_paths
from kglightning.datamodules.graph_forms import collate_graphs
from kglightning.datamodules.graph_row_checks import check_table
from kglightning.datamodules.graph_rows import (
    GraphRowError,
    build_graph_rows,
    check_rows,
    code_digest,
    graph_features,
    graphs_from_rows,
    records_rows,
    row_stats,
    row_texts,
)
from kglightning.datamodules.relation_prior import RelationPrior
from kglightning.evidence.answer_signals import SIGNALS
from kglightning.retrieval.faiss_grounding import FaissGrounder

log = logging.getLogger(__name__)

BUILD_CHUNK = 256  # questions per stored piece of a split's graph rows (the unit a stopped run does not repeat)

AnswerFeature = Literal[
    "path_score", "hops", "relation_prior", "votes", "first_rank", "log_answers", "cited_paths", "cited_in_graph",
    "log_degree", "log_graph_size",
]  # fmt: skip
ANSWER_FEATURES: tuple[str, ...] = ("path_score", "hops", "relation_prior", *SIGNALS)
ON_PATHS = frozenset({"path_score", "hops", "relation_prior"})  # features that need the answers' relation paths


class DetectionDataModule(KGQADataModule):
    """Graphs for KG-Guard: records with ``prediction`` become augmented subgraphs with labelled answer nodes.

    Records that carry no ``prediction`` get one from ``proposer`` (a KBQA system, by default none); its output
    is cached per dataset and proposer configuration, so it runs once. The graphs are built by a cached map
    (:meth:`graph_rows`) and the embeddings of their texts (node labels, relations, questions, ungrounded answers)
    computed once in :meth:`prepare_data`; both are kept on disk. ``test`` builds the validation graphs
    too (a :class:`~kglightning.callbacks.ConformalCallback` may calibrate on them).

    Args:
        proposer: KBQA system that proposes answers for records without ``prediction``.
        encoder: text encoder of nodes, relations and questions (default: the proposer's, else the bundled
            all-MiniLM-L6-v2).
        add_reverse_edges: add an explicit reverse edge ``t → h`` for every triple.
        batch_size: graphs per batch.
        baselines: LLM-based detectors (:class:`~kglightning.data.proposer.AnswerNodeScorer`, e.g.
            :class:`~kglightning.llm.node_judges.LLMJudge`, :class:`~kglightning.llm.node_judges.SelfCheck`) that
            score the test split's answer nodes; each graph then carries ``baseline_scores`` ``(answers,
            len(baselines))`` and the detector's test table lists them as ``test/<name>/*``.
        answer_features: extra inputs of the detector's classifiers per answer (the graph model's and the
            ungrounded scorer's), in the order given: ``"path_score"`` (the highest cosine similarity between the
            question and a shortest relation path from a topic entity to the answer, as text; 0 without a path),
            ``"hops"`` (that path's length over ``path_max_hops``; ``1 + 1 / path_max_hops`` when no topic entity
            reaches the answer), ``"relation_prior"`` (how often the training questions most like this one were
            answered along one of the relation paths that reach this answer,
            :class:`~kglightning.datamodules.relation_prior.RelationPrior` over ``prior_neighbours`` questions of the
            train split), and what the LLM's output says of the answer
            (:mod:`~kglightning.evidence.answer_signals`): ``"votes"``, ``"first_rank"``, ``"log_answers"``,
            ``"cited_paths"``, ``"cited_in_graph"``, ``"log_degree"``, ``"log_graph_size"``. The CLI links their
            number to ``model.init_args.answer_features``.
        path_max_hops: longest path searched for ``answer_features``.
        prior_neighbours: how many training questions vote in ``"relation_prior"``.
        ungrounded: what becomes of an answer that names no node of its graph (after exact, RoG-normalised and
            ``near_miss`` matching): ``"keep"`` scores it (the detector's ``ungrounded_scorer``) and reports it in
            ``test/all/*``; ``"drop"`` leaves it out (counted), as KG-Guard's node-level task does.
        near_miss: grounds an answer that matches no node by name to its nearest node name
            (:class:`~kglightning.retrieval.FaissGrounder`, above its ``min_similarity``); ``None``: names only.
        relation_view: how relations are written for the text encoder (edge types and ``path_score``'s paths):
            ``"readable"`` (``location country capital``), ``"raw"`` (``location.country.capital``) or ``"leaf"``
            (``capital``); see :func:`~kglightning.data.text.relation_text`.
        build_workers: processes that build a split's graphs (``num_proc`` of the cached map that builds them,
            :meth:`graph_rows`; the graphs and counts are those of one process). With ``near_miss`` set the graphs
            are built in one process.
        **kwargs: the record-reading arguments of :class:`~kglightning.datamodules.KGQADataModule` (``data_dir``,
            ``max_records``, ``on_bad_record``, ``cache_dir``, ...).

    Example:
        A folder of ``train``, ``validation`` and ``test`` records (RoG's format) with the LLM's answers in
        ``prediction`` becomes batches of graphs, their texts embedded by the bundled all-MiniLM-L6-v2 encoder:

        >>> import json, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> record = {"question": "Which country is Paris the capital of?", "answer": ["France"],
        ...           "q_entity": ["Paris"], "a_entity": ["France"], "prediction": ["France", "Europe"],
        ...           "graph": [["Paris", "capital of", "France"], ["Paris", "located in", "Europe"]]}
        >>> for split in ("train", "validation", "test"):
        ...     with open(f"{tmp.name}/{split}.jsonl", "w") as f:
        ...         for i in range(4):
        ...             print(json.dumps({"id": f"{split}-{i}", **record}), file=f)
        >>> dm = DetectionDataModule(data_dir=tmp.name, cache_dir=f"{tmp.name}/cache", batch_size=4)
        >>> dm.prepare_data(); dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch.num_graphs, batch.answer_names[0], batch.y.tolist()[:2]  # y = 1: not a gold answer
        (4, ['France', 'Europe'], [0.0, 1.0])
        >>> tuple(batch.x_text.shape)  # 4 nodes a graph (Paris, France, Europe, the question), 384-wide texts
        (16, 384)
        >>> tmp.cleanup()
    """

    stage_splits: ClassVar[dict[str, tuple[str, ...] | None]] = {
        **KGQADataModule.stage_splits,
        "test": ("validation", "test"),
    }
    prepare_splits: ClassVar[dict[str, tuple[str, ...] | None]] = {
        **KGQADataModule.prepare_splits,
        "test": ("validation", "test"),
    }

    def __init__(
        self,
        proposer: AnswerProposer | None = None,
        encoder: SentenceEncoder | None = None,
        add_reverse_edges: bool = True,
        batch_size: int = 32,
        baselines: list[AnswerNodeScorer] | None = None,
        answer_features: list[AnswerFeature] | None = None,
        path_max_hops: int = 3,
        prior_neighbours: int = 10,
        ungrounded: Literal["keep", "drop"] = "keep",
        near_miss: FaissGrounder | None = None,
        relation_view: RelationView = "readable",
        build_workers: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)
        if build_workers < 1:
            raise ValueError(f"build_workers must be >= 1, got {build_workers}")
        self.build_workers = build_workers
        self.proposer = proposer
        self.baselines = list(baselines or [])
        names = [b.name for b in self.baselines]
        if len(set(names)) < len(names):
            raise ValueError(f"baseline names must be distinct, got {names}")
        self.answer_features = list(answer_features or [])
        unknown = set(self.answer_features) - set(ANSWER_FEATURES)
        if unknown or len(set(self.answer_features)) < len(self.answer_features):
            raise ValueError(
                f"answer_features must be distinct names of {', '.join(ANSWER_FEATURES)}; got {self.answer_features}"
            )
        if path_max_hops < 1:
            raise ValueError(f"path_max_hops must be >= 1, got {path_max_hops}")
        self.path_max_hops = path_max_hops
        self.prior_neighbours = prior_neighbours
        self._prior: RelationPrior | None = None
        if prior_neighbours < 1:
            raise ValueError(f"prior_neighbours must be >= 1, got {prior_neighbours}")
        if ungrounded not in ("keep", "drop"):
            raise ValueError(f"ungrounded must be 'keep' or 'drop', got {ungrounded!r}")
        self.ungrounded = ungrounded
        self.near_miss = near_miss
        if relation_view not in RELATION_VIEWS:
            raise ValueError(f"relation_view must be one of {RELATION_VIEWS}, got {relation_view!r}")
        self.relation_view = relation_view
        self._paths: dict[str, dict[str, list[tuple[int | None, list[str]]]]] = {}
        self.encoder = encoder or (proposer.encoder_hint if proposer is not None else None) or SentenceEncoder()
        self.add_reverse_edges = add_reverse_edges
        self.stats: dict[str, DetectionStats] = {}
        self._embeddings: EmbeddingCache | None = None
        self._answered: dict[str, list[KGQARecord]] = {}
        self._embedded: set[str] = set()
        self._rows: dict[str, Any] = {}
        self._folders: dict[str, Path] = {}

    @property
    def text_dim(self) -> int:
        """Size of the text embeddings (linked to the model's ``text_dim``)."""
        return self.encoder.dim

    @property
    def embeddings(self) -> EmbeddingCache:
        if self._embeddings is None:
            self._embeddings = EmbeddingCache(self.encoder, self.cache_root / "embeddings")
        return self._embeddings

    def records(self, split: str) -> list[KGQARecord]:
        """The split's records, with predictions (from the data, the proposal cache or the proposer)."""
        if split not in self._answered:
            self._answered[split] = self._answer(split)
        return self._answered[split]

    def _answer(self, split: str) -> list[KGQARecord]:
        records = self.read_split(split)
        lacking = [r for r in records if r.prediction is None]
        if not lacking:
            return list(records)
        if self.proposer is None:
            raise RecordError(
                f"{len(lacking)} of {len(records)} records have no 'prediction' (first: id {lacking[0].id!r}); give "
                "records with predictions or set data.init_args.proposer",
                source=records.source,
                field="prediction",
            )
        proposer = self.proposer.for_split(split)
        # the proposer's key may hold '/' or a server's model id ('../'): one safe folder name
        cache = self.cache_root / "proposals-v2" / self.dataset_key(split) / folder_name(proposer.cache_key)
        cache = cache / f"{split}.jsonl"
        cached = load_proposals(records, cache)
        if cached is not None:
            return cached
        rank_zero_info(f"proposing answers for {len(lacking)} {split} questions with {type(proposer).__name__}")
        proposed = iter(proposer.propose(lacking))
        out = [r if r.prediction is not None else next(proposed) for r in records]
        save_proposals(records, out, cache)
        return out

    @property
    def num_answer_features(self) -> int:
        """How many extra inputs per answer node the classifier gets (linked to the detector)."""
        return len(self.answer_features)

    def answer_paths(self, split: str) -> dict[str, list[tuple[int | None, list[str]]]]:
        """Per record id: for each distinct prediction, its hop count and shortest relation-path texts."""
        if split not in self._paths:
            self._paths[split] = {r.id: self._record_paths(r) for r in self.records(split)}
        return self._paths[split]

    def _record_paths(self, record: KGQARecord) -> list[tuple[int | None, list[str]]]:
        """For each distinct prediction of ``record``, its hop count and shortest relation-path texts."""
        answers = list(dict.fromkeys(record.prediction or []))
        return answer_paths(record, answers, self.path_max_hops, relation_view=self.relation_view)

    def prepare_split(self, split: str) -> None:
        """Propose answers for ``split`` (or read them from the cache) and encode its texts."""
        if split not in self._embedded:
            texts = set(row_texts(self.graph_rows(split)).to_pylist())
            if "path_score" in self.answer_features:
                texts.update(t for paths in self.answer_paths(split).values() for _, ts in paths for t in ts)
            self.embeddings.add(texts)
            self._embedded.add(split)

    def _attach_answer_features(
        self,
        pairs: list[tuple[KGQARecord, Data]],
        paths: Sequence[list[tuple[int | None, list[str]]]],
        emb: EmbeddingCache | TextView,
        own: Sequence[str | None],
    ) -> None:
        """Set each graph's ``answer_features``: ``paths`` per pair (:meth:`answer_paths`' values), ``emb`` holds
        every text they need, ``own`` per pair the training question left out of its own prior (its id)."""
        wanted = self.answer_features
        ids = emb._index
        column = {name: i for i, name in enumerate(SIGNALS)}
        by_record = [dict(zip(dict.fromkeys(r.prediction or []), found)) for (r, _), found in zip(pairs, paths)]
        prior: list[list[float]] = []
        if "relation_prior" in wanted:
            questions = emb.rows([ids[r.question] for r, _ in pairs])
            answers = [[set(by_name.get(n, (None, []))[1]) for n in g.answer_names] for by_name, (_, g) in
                       zip(by_record, pairs)]  # fmt: skip
            prior = self.relation_prior().score(questions, answers, own)
        for i, (record, g) in enumerate(pairs):
            by_name = by_record[i]
            question = emb.rows([ids[record.question]])[0] if "path_score" in wanted else None
            rows = []
            for a, name in enumerate(g.answer_names):
                hops, texts = by_name.get(name, (None, []))
                feats = {}  # only the features asked for: path texts are embedded for path_score alone
                if question is not None:
                    feats["path_score"] = float((emb.rows([ids[t] for t in texts]) @ question).max()) if texts else 0.0
                if "hops" in wanted:
                    feats["hops"] = (hops if hops is not None else self.path_max_hops + 1) / self.path_max_hops
                if prior:
                    feats["relation_prior"] = prior[i][a]
                rows.append([feats[f] if f in feats else float(g.answer_signals[a, column[f]]) for f in wanted])
            g.answer_features = torch.tensor(rows, dtype=torch.float).view(-1, len(wanted))

    def relation_prior(self) -> RelationPrior:
        """The ``"relation_prior"`` feature's model, fitted on the train split once: each training question's
        embedding and the relation paths that reach its gold answers (``answer`` and ``a_entity``)."""
        if self._prior is None:
            train = self.records("train")
            self.embeddings.add({r.question for r in train})  # only the questions: a test run embeds no more
            gold = [
                {t for _, texts in answer_paths(r, list(dict.fromkeys([*r.answer, *r.a_entity])), self.path_max_hops,
                                                relation_view=self.relation_view) for t in texts}
                for r in train
            ]  # fmt: skip
            questions = self.embeddings.rows([self.embeddings._index[r.question] for r in train])
            self._prior = RelationPrior(self.prior_neighbours).fit(questions, gold, [r.id for r in train])
        return self._prior

    def graph_folder(self, split: str) -> Path:
        """Where ``split``'s graph rows are kept (:mod:`~kglightning.datamodules.graph_rows`): keyed by
        :meth:`dataset_key`, everything of the records the rows are built from
        (:func:`~kglightning.data.digest.records_digest`: fields, proposed predictions, triples), the
        graph settings, the near-miss grounder's :attr:`~kglightning.retrieval.FaissGrounder.cache_key`, the code
        that builds the rows (:func:`~kglightning.datamodules.graph_rows.code_digest`) and the records'
        :data:`~kglightning.data.records.VALIDATION_VERSION`. Computed once per split."""
        if split not in self._folders:
            key = fingerprint(
                code_digest(), VALIDATION_VERSION, records_digest(self.records(split)), self.add_reverse_edges,
                self.ungrounded, self.relation_view, None if self.near_miss is None else self.near_miss.cache_key,
            )  # fmt: skip
            self._folders[split] = self.cache_root / "detection_graphs" / self.dataset_key(split) / key
        return self._folders[split]

    def graph_rows(self, split: str) -> Any:
        """``split``'s graphs as rows (a ``datasets.Dataset``, one row per record; see
        :mod:`~kglightning.datamodules.graph_rows`): a cached map over the records on ``build_workers`` processes,
        read back whole when a run with the same inputs stored them, resumed where a stopped run left off."""
        if split not in self._rows:
            import datasets

            records = self.records(split)
            folder = self.graph_folder(split)
            done = stored_map(folder)
            if done is not None and len(done) == len(records):
                try:
                    check_rows(done)
                except GraphRowError as err:  # damaged stored rows: said, removed and built again
                    del done
                    self._drop_rows(split, err)
                    done = None
            if done is None or len(done) != len(records):
                workers = self.build_workers
                if workers > 1 and self.near_miss is not None:  # the grounder encodes answers: kept in this process
                    log.info("%s: near_miss grounding is on; building the graphs in one process", split)
                    workers = 1
                questions = datasets.Dataset.from_dict({"index": list(range(len(records)))})
                done = cached_map(
                    questions, build_graph_rows, graph_features(), folder, workers=workers, piece=BUILD_CHUNK,
                    state=(records, self.add_reverse_edges, self.ungrounded, self._near, self.relation_view),
                    desc=f"{split} graphs", progress=len(records) >= BUILD_CHUNK,
                )  # fmt: skip
            self._rows[split] = done
        return self._rows[split]

    def _drop_rows(self, split: str, err: GraphRowError) -> None:
        """Say that ``split``'s stored graph rows are damaged, forget them and set them aside
        (:func:`~kglightning.data.store.cache_marks.set_aside`; built again when asked for, their texts embedded
        again)."""
        folder = self.graph_folder(split)
        self._rows.pop(split, None)
        self._embedded.discard(split)
        why = f"holds {split} graph rows that are damaged ({err})"
        if set_aside(folder, why) is None:  # said; it could not be moved: removed
            shutil.rmtree(folder, ignore_errors=True)

    def build_split(self, split: str) -> list[Data]:
        records = self.records(split)
        for attempt in range(2):
            try:  # kept for every epoch as compact graphs; collate expands them
                self.prepare_split(split)
                rows = self.graph_rows(split)
                del self._rows[split]  # not kept once read: the pages of its map would stay in this process's memory
                pairs = [(records[i], g) for i, g in graphs_from_rows(rows, self.embeddings._index,
                                                                       self.add_reverse_edges)]  # fmt: skip
                stale = next(((r, g) for r, g in pairs if g.qid != r.id), None)
                if stale is not None:
                    raise GraphRowError(f"graph row of record {stale[0].id!r} holds the graph of {stale[1].qid!r}")
                stats = row_stats(rows)
                break
            except GraphRowError as err:  # damaged stored rows: said, removed and built again (once)
                if attempt:
                    raise GraphRowError(f"{err} (in rows this run has just built: a fault of the code that builds "
                                        "them, not of the cache)") from err  # fmt: skip
                self._drop_rows(split, err)
        del rows
        graphs = [g for _, g in pairs]
        for i, g in enumerate(graphs):  # names the graph across DDP processes (padded repeats are dropped by it)
            g.item_id = i
        if self.answer_features and pairs:
            found = self.answer_paths(split) if ON_PATHS & set(self.answer_features) else {}  # searched for these alone
            paths = [found.get(r.id, []) for r, _ in pairs]
            self._attach_answer_features(pairs, paths, self.embeddings, [r.id for r, _ in pairs])
        if split == "test" and self.baselines and pairs:
            self._attach_baseline_scores(pairs)
        if not graphs:
            raise ValueError(f"split {split!r} has no answer node to classify: {stats.summary(split)}")
        self.stats[split] = stats
        rank_zero_info(stats.summary(split))
        if stats.unmatched:
            log.warning(
                "%s: %d predictions name no node of their subgraph (%s), e.g. %s",
                split,
                stats.unmatched,
                "scored as ungrounded answers" if self.ungrounded == "keep" else "dropped",
                "; ".join(stats.unmatched_examples),
            )
        return graphs

    def request_graphs(self, records: Sequence[KGQARecord], table: RequestEmbeddings) -> list[Data | None]:
        """The graphs of records sent to a service, one by one, built and given their answer features as a split's
        are (the same rows, :func:`~kglightning.datamodules.graph_rows.records_rows`); ``None`` for a record with no
        answer to classify. Each record's texts are rows of ``table`` of its own (:meth:`RequestEmbeddings.view`), so
        a graph does not depend on the records beside it; :meth:`collate` them with ``table.rows``."""
        out: list[Data | None] = []
        for record, rows, paths, texts in self._request_rows(records):
            view = table.view(texts)
            built = [g for _, g in graphs_from_rows(rows, view._index, self.add_reverse_edges, check=False)]
            if built and self.answer_features:
                self._attach_answer_features([(record, built[0])], [paths], view, [None])
            out.append(built[0] if built else None)
        return out

    def request_texts(self, records: Sequence[KGQARecord]) -> list[str]:
        """The texts :meth:`request_graphs` embeds for ``records``, each once (to encode into the cache ahead, as a
        server on data it was trained on finds them there)."""
        return list(dict.fromkeys(t for *_, texts in self._request_rows(records) for t in texts))

    def _request_rows(self, records: Sequence[KGQARecord]) -> Iterator[tuple[KGQARecord, Any, list, list[str]]]:
        """Per record: its graph row (a one-row table), its answers' paths and the texts its graph needs."""
        searched = bool(ON_PATHS & set(self.answer_features))
        every = records_rows(records, range(len(records)), self.add_reverse_edges, self.ungrounded, self._near,
                             self.relation_view)  # fmt: skip
        check_table(every)  # once for the batch (each row is read on its own)
        for k, record in enumerate(records):
            rows = every.slice(k, 1)
            paths = self._record_paths(record) if searched else []
            on_paths = [t for _, ts in paths for t in ts] if "path_score" in self.answer_features else []
            yield record, rows, paths, [*rows.column("texts")[0].as_py(), record.question, *on_paths]

    def _near(self, record: KGQARecord) -> Callable[[str], str | None] | None:
        """``answer -> node name`` by :attr:`near_miss` over ``record``'s nodes (``None`` without a grounder)."""
        if self.near_miss is None:
            return None
        grounder = self.near_miss
        names = sorted({n for h, _, t in record.graph for n in (h, t)})

        def near(answer: str) -> str | None:
            return grounder.nearest([answer], names)[0][0] if names else None

        return near

    @property
    def baseline_names(self) -> list[str]:
        """The names of :attr:`baselines`, in column order of ``baseline_scores``."""
        return [b.name for b in self.baselines]

    def _attach_baseline_scores(self, pairs: list[tuple[KGQARecord, Data]]) -> None:
        records = [r for r, _ in pairs]
        columns = []
        for scorer in self.baselines:
            fit = getattr(scorer, "fit", None)
            if callable(fit):  # a learned baseline (e.g. StructuralBaseline) is fitted on the training split
                rank_zero_info(f"fitting {scorer.name} on the train split")
                fit(self.records("train"))
            rank_zero_info(f"scoring {sum(len(g.answer_names) for _, g in pairs)} test answer nodes with {scorer.name}")
            columns.append(scorer.score(records))
        for i, (_, g) in enumerate(pairs):
            g.baseline_scores = torch.tensor(
                [[col[i].get(name, 0.5) for col in columns] for name in g.answer_names], dtype=torch.float
            ).view(-1, len(columns))

    def collate(self, items: list[Data]) -> Batch:
        """Batch graphs and look their texts up in the embedding table
        (:func:`~kglightning.datamodules.graph_forms.collate_graphs`)."""
        return collate_graphs(items, self.embeddings.rows)
