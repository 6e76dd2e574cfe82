"""A seeded generator of RoG-format KGQA records at a chosen size, for scale benchmarks.

The records look like RoG's WebQSP and CWQ (``rmanluo/RoG-webqsp``, ``rmanluo/RoG-cwq``) where size is concerned:

* each question's graph is a 2-hop neighbourhood of its topic entity, with a heavy-tailed number of triples
  (log-normal around ``triples``), parallel relations, inverse-looking duplicates and reified CVT nodes
  (``m.0...`` ids with no name, as in Freebase) between an entity and its facts;
* node names come from one shared pool with a Zipf-like popularity, so a few hub entities (``Male``, a country...)
  appear in most graphs and reach thousands of edges, and distinct strings grow sub-linearly with questions;
* relations are Freebase-like ``domain.type.property`` names from a pool of ``relations``;
* 1 to 4 gold answers, each 1 to 4 hops from the topic entity (a short chain beyond the 2-hop neighbourhood for
  3 and 4), with ``a_entity`` set;
* a ``prediction`` list per question (gold answers, graph nodes that are wrong, and now and then a name that is not a
  node), so the detector's data path has real work to do.

Sizes: WebQSP has 2,826 / 246 / 1,628 questions and CWQ 27,639 / 3,519 / 3,531 (the RoG dataset cards); CWQ's card
gives 11.27 GB of Arrow data for its 34,689 questions, about 325 KB per question, or some four thousand triples of
Freebase-length strings. ``--triples 4000`` is therefore the default.

    PYTHONPATH=. python tools/bench/rog_generator.py --questions 1628 --output /tmp/scale/webqsp/test.jsonl
    PYTHONPATH=. python tools/bench/rog_generator.py --preset webqsp --output-dir /tmp/scale/webqsp
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

PRESETS: dict[str, dict[str, int]] = {
    "webqsp": {"train": 2826, "validation": 246, "test": 1628},
    "cwq": {"train": 27639, "validation": 3519, "test": 3531},
}
_WORDS = (
    "people person location country film actor music album sports team award book author government office "
    "position organization education school university language religion ethnicity nationality place birth death "
    "parent child sibling spouse currency capital city state region river mountain event date genre producer "
    "director character series season episode company industry product founder employee title role league"
).split()


class RoGGenerator:
    """Draws RoG records; the same ``seed`` gives the same records, question by question.

    Args:
        seed: the random seed.
        triples: the median number of triples per question (log-normal, sigma 0.6, at least 20).
        entities: size of the shared pool of entity names.
        relations: size of the pool of relation names.
        cvt_rate: fraction of a topic's facts that go through a CVT node.
        ungrounded_rate: chance that a question's predictions include a name that is no node of its graph.
    """

    def __init__(
        self,
        seed: int = 0,
        triples: int = 4000,
        entities: int = 2_000_000,
        relations: int = 5000,
        cvt_rate: float = 0.3,
        ungrounded_rate: float = 0.25,
    ) -> None:
        if triples < 20:
            raise ValueError(f"triples must be >= 20, got {triples}")
        self.seed, self.triples, self.entities = seed, triples, entities
        self.cvt_rate, self.ungrounded_rate = cvt_rate, ungrounded_rate
        rng = np.random.default_rng([seed, 0])
        words = np.array(_WORDS)
        parts = rng.integers(0, len(words), size=(relations, 4))
        self.relation_names = [
            f"{words[a]}.{words[b]}.{words[c]}_{words[d]}" if i % 3 else f"{words[a]}.{words[b]}.{words[c]}"
            for i, (a, b, c, d) in enumerate(parts)
        ]
        self.relation_names = list(dict.fromkeys(self.relation_names))
        # Zipf-like popularity of entity ranks: rank r is drawn with probability ~ 1 / (r + 10)
        self._cdf = np.cumsum(1.0 / (np.arange(entities) + 10.0))
        self._cdf /= self._cdf[-1]

    def entity_name(self, rank: int) -> str:
        """The name of the entity of popularity ``rank`` (readable, unique per rank)."""
        w = _WORDS[rank % len(_WORDS)].capitalize()
        return f"{w} {rank}" if rank >= 100 else f"{w} hub {rank}"

    def _entities(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.searchsorted(self._cdf, rng.random(n)).astype(np.int64)

    def record(self, index: int, split: str = "train") -> dict:
        """The ``index``-th record of ``split``, as a RoG dict."""
        rng = np.random.default_rng([self.seed, hash_split(split), index])
        size = max(20, int(round(self.triples * math.exp(rng.normal(0.0, 0.6) - 0.18))))
        topic_rank = int(self._entities(rng, 1)[0]) + 100  # topics are not the top hubs
        topic = self.entity_name(topic_rank)
        rels = self.relation_names
        graph: list[list[str]] = []
        first = max(4, int(math.sqrt(size)))  # first-hop fan-out; the rest hangs off those nodes
        hop1: list[str] = []
        cvt_count = 0
        for k in range(first):
            rel = rels[int(rng.integers(len(rels)))]
            if rng.random() < self.cvt_rate:
                cvt = f"m.0{self.seed:x}{index:x}{split[0]}{cvt_count:x}"
                cvt_count += 1
                graph.append([topic, rel, cvt])
                node = cvt
            else:
                node = self.entity_name(int(self._entities(rng, 1)[0]))
                graph.append([topic, rel, node] if k % 4 else [node, rel, topic])
            hop1.append(node)
        rest = size - len(graph)
        heads = rng.integers(0, len(hop1), size=rest)
        tails = self._entities(rng, rest)
        rel_ids = rng.integers(0, len(rels), size=rest)
        flip = rng.random(rest) < 0.3
        for h, t, r, f in zip(heads.tolist(), tails.tolist(), rel_ids.tolist(), flip.tolist()):
            a, b = hop1[h], self.entity_name(t)
            graph.append([b, rels[r], a] if f else [a, rels[r], b])
        if size > 50:  # a few exact repeats and parallel relations, as real subgraphs have
            for j in rng.integers(0, len(graph), size=size // 50).tolist():
                graph.append(list(graph[j]))
        named = [n for n in hop1 if not n.startswith("m.0")]
        hop2 = [t if not f else b for (b, _, t), f in zip(graph[first : first + rest], flip.tolist())]
        hop2 = [n for n in hop2 if n != topic and n not in hop1] or hop1
        gold = []
        for d in rng.integers(1, 5, size=int(rng.integers(1, 5))).tolist():  # 1 to 4 hops from the topic
            if d == 1 and named:
                gold.append(named[int(rng.integers(len(named)))])
                continue
            node = hop2[int(rng.integers(len(hop2)))]
            for _ in range(d - 2):  # a chain beyond the 2-hop neighbourhood
                nxt = self.entity_name(int(self._entities(rng, 1)[0]))
                graph.append([node, rels[int(rng.integers(len(rels)))], nxt])
                node = nxt
            gold.append(node)
        gold = list(dict.fromkeys(g for g in gold if g != topic)) or [hop2[0]]
        nodes = [n for n in dict.fromkeys(x for h, _, t in graph for x in (h, t)) if not n.startswith("m.0")]
        wrong = [nodes[int(i)] for i in rng.integers(1, len(nodes), size=int(rng.integers(0, 4)))]
        prediction = list(dict.fromkeys(gold[: max(1, len(gold) - int(rng.integers(0, 2)))] + wrong))
        if rng.random() < self.ungrounded_rate:
            prediction.append(f"Unlisted {self.entity_name(int(rng.integers(self.entities)))}")
        return {
            "id": f"{split}-{index}",
            "question": f"what {rels[int(rng.integers(len(rels)))].split('.')[-1].replace('_', ' ')} of {topic}?",
            "answer": gold,
            "q_entity": [topic],
            "a_entity": gold,
            "graph": graph,
            "prediction": prediction,
        }

    def records(self, n: int, split: str = "train") -> Iterator[dict]:
        for i in range(n):
            yield self.record(i, split)


def hash_split(split: str) -> int:
    """A stable integer for a split name (Python's ``hash`` of a str changes between processes)."""
    return int.from_bytes(split.encode()[:8].ljust(8, b"\0"), "little")


def write(gen: RoGGenerator, n: int, split: str, path: Path) -> int:
    """Write ``n`` records of ``split`` to ``path`` (jsonl); return the number of triples."""
    path.parent.mkdir(parents=True, exist_ok=True)
    triples = 0
    with open(path, "w", encoding="utf-8") as f:
        for rec in gen.records(n, split):
            triples += len(rec["graph"])
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return triples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), help="write train/validation/test at this dataset's size")
    p.add_argument("--output-dir", type=Path, help="folder for --preset")
    p.add_argument("--questions", type=int, help="questions of one file (with --output)")
    p.add_argument("--split", default="train")
    p.add_argument("--output", type=Path)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the preset's questions")
    p.add_argument("--triples", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    gen = RoGGenerator(seed=args.seed, triples=args.triples)
    if args.preset:
        if args.output_dir is None:
            p.error("--preset needs --output-dir")
        for split, n in PRESETS[args.preset].items():
            n = max(1, int(n * args.scale))
            t = write(gen, n, split, args.output_dir / f"{split}.jsonl")
            print(f"{split}: {n} questions, {t} triples")
    else:
        if args.questions is None or args.output is None:
            p.error("give --preset and --output-dir, or --questions and --output")
        t = write(gen, args.questions, args.split, args.output)
        print(f"{args.split}: {args.questions} questions, {t} triples")


if __name__ == "__main__":
    main()
