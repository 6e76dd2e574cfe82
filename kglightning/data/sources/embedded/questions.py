"""Turn templates into concrete questions whose gold answers are exactly what the full KG says.

The question pool does not depend on the build seed: it is drawn with a fixed seed per template, so every seed of
the benchmark asks the same questions (the seed changes the split, the subgraphs and which answers go missing).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from .kg import KnowledgeGraph
from .templates import Template
from .templates_elements import ELEMENT_TEMPLATES
from .templates_geography import GEOGRAPHY_TEMPLATES


def all_templates() -> list[Template]:
    """Every template of the benchmark (geography and elements), with unique names."""
    out = [*GEOGRAPHY_TEMPLATES, *ELEMENT_TEMPLATES]
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ValueError("duplicate template names")
    return out


#: Questions with more gold answers than this are not asked.
MAX_ANSWERS = 30
#: Constraint templates are skipped when the path reaches more candidates than this.
MAX_CANDIDATES = 60
#: Fixed seed of the question pool.
POOL_SEED = "kglightning-embedded-pool"


@dataclass(frozen=True)
class Question:
    """One question over the full KG.

    Args:
        qid: stable id derived from the question text.
        template: the template it instantiates.
        text: the question.
        topic: topic entity (where ``relation_path`` starts).
        constraint: constraint entity or ``None``.
        answers: gold answer node ids, sorted by name.
    """

    qid: str
    template: Template
    text: str
    topic: int
    constraint: int | None
    answers: tuple[int, ...]

    @property
    def q_entities(self) -> list[int]:
        """Topic entity first, then the constraint entity (CWQ records list every mentioned entity)."""
        return [self.topic] + ([self.constraint] if self.constraint is not None else [])


def walk(kg: KnowledgeGraph, tpl: Template, topic: int) -> set[int] | None:
    """The nodes reached from ``topic`` along ``tpl.path``, or ``None`` when ``tpl.hop_kinds`` is violated."""
    frontier = {topic}
    for i, step in enumerate(tpl.path):
        frontier = {other for node in frontier for _, other in kg.step_edges(node, step)}
        wanted = tpl.hop_kinds[i] if i < len(tpl.hop_kinds) else None
        if wanted is not None and any(kg.kinds[n] != wanted for n in frontier):
            return None
        if not frontier:
            return frontier
    return frontier


def instantiate(
    kg: KnowledgeGraph, tpl: Template, topic: int, rng: random.Random, used: frozenset[int] = frozenset()
) -> Question | None:
    """A question for ``topic``, or ``None`` when the topic does not give a well-posed one.

    ``used`` lists constraint entities already asked about for this topic.
    """
    if kg.qualified[topic] or not kg.has_step(topic, tpl.path[0]):
        return None
    if tpl.exclude_topic_step and kg.has_step(topic, tpl.exclude_topic_step):
        return None
    reached = walk(kg, tpl, topic)
    if not reached:
        return None
    constraint = None
    answers = reached
    if tpl.constraint is not None:
        if len(reached) > MAX_CANDIDATES:
            return None
        by_value: dict[int, set[int]] = {}
        for node in reached:
            for _, value in kg.step_edges(node, tpl.constraint):
                by_value.setdefault(value, set()).add(node)
        options = sorted(
            v
            for v, hit in by_value.items()
            if 1 <= len(hit) < len(reached) and not kg.qualified[v] and v != topic and v not in hit and v not in used
        )
        if not options:
            return None
        constraint = rng.choice(options)
        answers = by_value[constraint]
    if not 1 <= len(answers) <= MAX_ANSWERS or topic in answers:
        return None
    phrasing = rng.choice(tpl.phrasings)
    text = phrasing.format(t=kg.names[topic], c=kg.names[constraint] if constraint is not None else "")
    qid = "emb-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
    ordered = tuple(sorted(answers, key=lambda n: (kg.names[n].casefold(), n)))
    return Question(qid, tpl, text, topic, constraint, ordered)


def generate_questions(kg: KnowledgeGraph, templates: list[Template] | None = None) -> list[Question]:
    """Draw up to ``quota`` questions per template (deterministic), dropping duplicate texts and ids."""
    out: list[Question] = []
    seen: set[str] = set()
    for tpl in templates if templates is not None else all_templates():
        rng = random.Random(f"{POOL_SEED}:{tpl.name}")
        topics = kg.nodes_of_kind(tpl.topic)
        rng.shuffle(topics)
        made = 0
        for topic in topics:
            used: set[int] = set()
            for _ in range(tpl.per_topic if tpl.constraint else 1):
                if made >= tpl.quota:
                    break
                q = instantiate(kg, tpl, topic, rng, frozenset(used))
                if q is None:
                    break
                if q.constraint is not None:
                    used.add(q.constraint)
                if q.text in seen or q.qid in seen:
                    continue
                seen.update((q.text, q.qid))
                out.append(q)
                made += 1
    return out
