"""SFT examples of the DoublyCal proxy (App. A.1): mining a record, its (prompt, completion) pairs, and batching.

* :func:`mine_row`: the record's mined, Bayesian-scored evidence and the grounded paths of RoG's auxiliary QA task;
* :func:`row_examples`: one *evidence* example per evidence (``sft_input`` -> ``format_evidence``), best confidence
  first, plus the optional *QA* example (``qa_input`` -> ``qa_target``);
* :func:`render_prompt`: the prompt text, with the tokenizer's chat template or plain;
* :func:`collate_sft` / :func:`collate_prompts`: right-padded training batches with ``labels`` (``-100`` outside
  the completion) and left-padded prompt batches for generation.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from kglightning.data.records import KGQARecord
from kglightning.data.text import neutralize_special_tokens, tokenizer_special_tokens
from kglightning.evidence.builder import EvidenceBuilder
from kglightning.evidence.format import (
    ConfidencePosition,
    format_evidence,
    qa_input,
    qa_target,
    rl_input,
    sft_input,
    writes_verbatim,
)
from kglightning.evidence.schema import Evidence
from kglightning.llm.backends.local_hf import load_tokenizer
from kglightning.llm.prompts import verbalize_path

IGNORE_INDEX = -100
"""Label of tokens outside the loss (prompt and padding), as in ``torch.nn.CrossEntropyLoss``."""

Split = Literal["train", "validation", "test"]
PromptStyle = Literal["chat", "plain"]
Instruction = Literal["sft", "rl"]


@functools.lru_cache(maxsize=4)
def _load_tokenizer(model: str, gguf_file: str | None) -> Any:
    return load_tokenizer(model, gguf_file)


def sft_tokenizer(model: str, gguf_file: str | None = None) -> Any:
    """A private copy of ``model``'s tokenizer; the loaded original is cached (GGUF tokenizers take seconds to read).

    Args:
        model: a local model folder, a ``.gguf`` file, or ``"bundled:smollm2"``.
        gguf_file: GGUF file name inside the ``model`` folder.
    """
    return copy.deepcopy(_load_tokenizer(model, gguf_file))


def render_prompt(
    tokenizer: Any, instruction: str, prompt_style: PromptStyle = "chat", system_prompt: str | None = None
) -> str:
    """The prompt text the completion follows: a chat user turn with the assistant turn opened, or plain text.

    Args:
        tokenizer: the model's tokenizer (its chat template is used when ``prompt_style="chat"``).
        instruction: the user instruction (e.g. :func:`~kglightning.evidence.format.sft_input`).
        prompt_style: ``"chat"`` (falls back to ``"plain"`` for a tokenizer without a chat template) or ``"plain"``:
            the instruction followed by a newline.
        system_prompt: a system turn for ``"chat"``; ``None`` leaves the template's default.

    Special-token strings in ``instruction`` (which carries a question from the data) are broken up
    (:func:`~kglightning.data.text.neutralize_special_tokens`), so that they stay text.
    """
    instruction = neutralize_special_tokens(instruction, tokenizer_special_tokens(tokenizer))
    if prompt_style == "chat" and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": instruction}]
        if system_prompt is not None:
            messages.insert(0, {"role": "system", "content": system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return instruction + "\n"


@dataclass(frozen=True)
class ProxyPrompt:
    """How the proxy's prompt is rendered (see :func:`render_prompt`); its SFT data and every later use agree on it.

    :class:`~kglightning.modules.ProxySFT` holds it as ``prompt_format``; the CLI links it to the
    :class:`~kglightning.datamodules.ProxySFTDataModule`, and the DoublyCal pipeline reads it from the proxy.

    Args:
        style: ``"chat"`` (the tokenizer's chat template) or ``"plain"`` (the instruction and a newline).
        system_prompt: a system turn for ``"chat"``; ``None`` leaves the template's default.
        instruction: which instruction asks for evidence: ``"sft"`` (App. A.1,
            :func:`~kglightning.evidence.format.sft_input`) or ``"rl"`` (App. A.2, the GRPO stage's
            :func:`~kglightning.evidence.format.rl_input`).

    Example:
        >>> ProxyPrompt(style="plain", instruction="rl").evidence_prompt(None, "who is snoopy's brother?")[:40]
        'Please generate an enhanced relation pat'
    """

    style: PromptStyle = "chat"
    system_prompt: str | None = None
    instruction: Instruction = "sft"

    def __post_init__(self) -> None:
        if self.style not in ("chat", "plain"):
            raise ValueError(f"style must be 'chat' or 'plain', got {self.style!r}")
        if self.instruction not in ("sft", "rl"):
            raise ValueError(f"instruction must be 'sft' or 'rl', got {self.instruction!r}")

    def render(self, tokenizer: Any, instruction: str) -> str:
        """The prompt text of ``instruction``."""
        return render_prompt(tokenizer, instruction, self.style, self.system_prompt)

    def evidence_instruction(self, question: str) -> str:
        """The instruction that asks for evidence about ``question`` (``sft_input`` or ``rl_input``)."""
        return (rl_input if self.instruction == "rl" else sft_input)(question)

    def evidence_prompt(self, tokenizer: Any, question: str) -> str:
        """The rendered prompt that asks for evidence about ``question``."""
        return self.render(tokenizer, self.evidence_instruction(question))


def _qa_paths(builder: EvidenceBuilder, record: KGQARecord, max_paths: int) -> list[str]:
    """Grounded shortest topic-answer paths, verbalized as RoG does (``q -> r -> x -> r2 -> a``)."""
    kg = builder.index(record)
    out: list[str] = []
    for topic in dict.fromkeys(record.q_entity):
        for answer in dict.fromkeys(record.a_entity):
            if topic == answer or topic not in kg or answer not in kg:
                continue
            for hops in kg.shortest_paths(topic, answer, builder.max_hops, max_paths - len(out)):
                out.append(verbalize_path([topic, *(x for _, r, t in hops for x in (r, t))]))
            if len(out) >= max_paths:
                return out
    return out


def mine_row(record: KGQARecord, builder: EvidenceBuilder, qa_max_paths: int = 5) -> dict[str, Any]:
    """The cached, JSON-ready mining result of one record.

    Args:
        record: the question with its graph and gold answers.
        builder: mines and scores the evidence.
        qa_max_paths: grounded paths kept for the auxiliary QA input.

    Returns:
        ``{"id", "question", "answer", "evidence": [Evidence.to_dict(), ...], "qa_paths": [str, ...]}``.

    Example:
        >>> rec = KGQARecord("q1", "Who is Snoopy's brother?", ["Spike"], ["Snoopy"], ["Spike"],
        ...     [("Snoopy", "sibling_of", "Spike"), ("Snoopy", "sibling_of", "Belle"),
        ...      ("Spike", "gender", "Male"), ("Belle", "gender", "Female")])
        >>> row = mine_row(rec, EvidenceBuilder())
        >>> [(z["relations"], z["constraint"], z["confidence"]) for z in row["evidence"]]
        [(['sibling_of'], None, 0.5), (['sibling_of'], ['gender', 'Male'], 0.75)]
        >>> row["qa_paths"]
        ['Snoopy -> sibling_of -> Spike']
    """
    evidence = builder.mine(record)
    return {
        "id": record.id,
        "question": record.question,
        "answer": list(record.answer),
        "evidence": [z.to_dict() for z in evidence],
        "qa_paths": _qa_paths(builder, record, qa_max_paths) if evidence else [],
    }


@dataclass(frozen=True)
class SFTExample:
    """One (prompt, completion) pair before chat rendering and tokenization.

    Args:
        qid: the question id.
        task: ``"evidence"`` (App. A.1) or ``"qa"`` (RoG's auxiliary task).
        instruction: the user instruction.
        target: the completion text (without EOS).
    """

    qid: str
    task: Literal["evidence", "qa"]
    instruction: str
    target: str


def row_examples(
    row: dict[str, Any],
    max_evidence: int | None = 3,
    qa_task: bool = True,
    digits: int = 2,
    confidence_position: ConfidencePosition = "open",
    unwritable: list[str] | None = None,
) -> list[SFTExample]:
    """The SFT examples of one mined row: evidence examples (best confidence first), then the QA example.

    An evidence the ``<PATH>`` format cannot write (a mined name with ``<`` or ``>``) is left out; with
    ``unwritable``, ``"<id>: <why>"`` is appended to it for each.

    Args:
        row: a :func:`mine_row` result.
        max_evidence: evidence examples per question (``None``: all mined evidence).
        qa_task: add the auxiliary QA example (when the row has grounded paths).
        digits: decimals of the confidence in the target.
        confidence_position: ``"open"`` (the paper's format) or ``"after"`` the path (:func:`format_evidence`).

    Example:
        >>> row = {"id": "q1", "question": "who is snoopy's brother?", "answer": ["Spike"], "qa_paths": [],
        ...        "evidence": [{"topic": "Snoopy", "relations": ["sibling_of"], "confidence": 0.5},
        ...                     {"topic": "Snoopy", "relations": ["sibling_of"], "constraint": ["gender", "Male"],
        ...                      "confidence": 0.75}]}
        >>> [x.target for x in row_examples(row, max_evidence=1)]
        ['<PATH confidence=0.75>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH>']
        >>> row_examples(row, max_evidence=1, qa_task=False, confidence_position="after")[0].target
        '<PATH>sibling_of<CONSTRAINT>gender<SEP>Male</CONSTRAINT></PATH> <CONFIDENCE>0.75</CONFIDENCE>'
    """
    evidence = sorted((Evidence.from_dict(d) for d in row["evidence"]), key=lambda z: -(z.confidence or 0.0))
    if max_evidence is not None:
        evidence = evidence[:max_evidence]
    instruction = sft_input(row["question"])
    write = functools.partial(format_evidence, digits=digits, confidence_position=confidence_position)
    out = []
    for z in evidence:
        names = [*z.relations, *(z.constraint or ())]
        bad = [n for n in names if not writes_verbatim(str(n).strip())]
        if bad:  # any other error of format_evidence is a bug upstream, and raises
            if unwritable is not None:
                unwritable.append(f"{row['id']}: {bad[0]!r} cannot be written in a <PATH> block")
            continue
        out.append(SFTExample(row["id"], "evidence", instruction, write(z.relations, z.constraint, z.confidence)))
    if qa_task and row["qa_paths"] and row["answer"]:
        out.append(SFTExample(row["id"], "qa", qa_input(row["question"], row["qa_paths"]), qa_target(row["answer"])))
    return out


@dataclass
class SFTStats:
    """What one split turned into: records read, records without evidence, examples per task, examples too long."""

    records: int = 0
    without_evidence: list[str] = field(default_factory=list)
    evidence_examples: int = 0
    qa_examples: int = 0
    too_long: int = 0
    unwritable: list[str] = field(default_factory=list)

    def summary(self, split: str) -> str:
        """One line for the log.

        Example:
            >>> SFTStats(10, ["q3"], 20, 9, 1).summary("train")
            'train: 10 records, 1 without evidence (skipped), 20 evidence + 9 QA examples, 1 longer than max_length (dropped)'
        """
        return (
            f"{split}: {self.records} records, {len(self.without_evidence)} without evidence (skipped), "
            f"{self.evidence_examples} evidence + {self.qa_examples} QA examples, "
            f"{self.too_long} longer than max_length (dropped)"
            + (f", {len(self.unwritable)} evidence the <PATH> format cannot write (dropped)" if self.unwritable else "")
        )


def _pad(rows: Sequence[Sequence[int]], value: int, left: bool) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    padded = [([value] * (width - len(r)) + list(r)) if left else (list(r) + [value] * (width - len(r))) for r in rows]
    return torch.tensor(padded, dtype=torch.long).reshape(len(rows), width)


def collate_prompts(items: Sequence[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Left-padded prompts (for generation) with the items' ``id``, ``question`` and ``answer`` passed through.

    Args:
        items: dicts with ``prompt_ids``, ``id``, ``question`` and optionally ``answer``.
        pad_id: the tokenizer's pad id.
    """
    prompts = [it["prompt_ids"] for it in items]
    return {
        "input_ids": _pad(prompts, pad_id, left=True),
        "attention_mask": _pad([[1] * len(p) for p in prompts], 0, left=True),
        "id": [it["id"] for it in items],
        "question": [it["question"] for it in items],
        "answer": [it.get("answer", []) for it in items],
    }


def collate_sft(items: Sequence[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Right-padded ``input_ids``/``attention_mask``/``labels`` (``-100`` on prompt and padding), plus ``prompt``:
    the left-padded prompts of the batch's distinct evidence-task questions (for generation checks).

    Args:
        items: :meth:`ProxySFTDataModule.encode` dicts (``input_ids``, ``prompt_len``, ``task``, ``id``).
        pad_id: the tokenizer's pad id.
    """
    ids = [it["input_ids"] for it in items]
    labels = [[IGNORE_INDEX] * it["prompt_len"] + list(it["input_ids"][it["prompt_len"] :]) for it in items]
    seen: dict[str, dict[str, Any]] = {}
    for it in items:
        if it["task"] == "evidence" and it["id"] not in seen:
            seen[it["id"]] = {"prompt_ids": it["input_ids"][: it["prompt_len"]], "id": it["id"], "question": ""}
    return {
        "input_ids": _pad(ids, pad_id, left=False),
        "attention_mask": _pad([[1] * len(x) for x in ids], 0, left=False),
        "labels": _pad(labels, IGNORE_INDEX, left=False),
        "task": [it["task"] for it in items],
        "prompt": collate_prompts(list(seen.values()), pad_id),
    }
