"""The DoublyCal reasoning proxy, SFT stage: a causal LM with a LoRA adapter (DoublyCal §4.2, App. B.1).

The proxy learns to write KG evidence with its Bayesian confidence (``<PATH confidence=...>...</PATH>``) from
(prompt, completion) batches of :class:`~kglightning.datamodules.sft.ProxySFTDataModule`, with the
cross-entropy of Eq. 9 on completion tokens only (labels are ``-100`` elsewhere). Only the LoRA weights train.

Checkpoints hold the trainable (LoRA) weights only; the frozen base model is rebuilt from ``model`` when a checkpoint
is loaded. :meth:`ProxySFT.save_adapter` writes a PEFT adapter folder (``save_pretrained``), which ``adapter_path``
loads back, e.g. for ``predict``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import MeanMetric, SumMetric

from kglightning.datamodules.sft import ProxyPrompt, sft_tokenizer
from kglightning.evidence.format import ParseResult, parse_evidence
from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2, load_causal_lm
from kglightning.llm.confidence_readout import ConfidenceReadout
from kglightning.llm.generation import generate_exactly
from kglightning.llm.lora import DEFAULT_TARGET_MODULES, LoRASettings
from kglightning.llm.parsing import ParseStats
from kglightning.llm.trie import KGTrie, KGTrieLogitsProcessor
from kglightning.modules.export import ExportChoice, exported_weights

__all__ = ["DEFAULT_TARGET_MODULES", "EvidenceGeneration", "ProxySFT"]

log = logging.getLogger(__name__)

Decoding = Literal["beam", "greedy"]


@dataclass(frozen=True)
class EvidenceGeneration:
    """How the proxy writes evidence at predict time; a nested group in configs.

    Args:
        num_evidence: evidence sequences per question (top-K beams; RoG and the paper use 3).
        decoding: ``"beam"`` (``num_evidence`` beams, all returned) or ``"greedy"`` (one sequence per question).
        max_new_tokens: longest generated evidence.
        confidence: ``"stated"`` keeps the confidence digits the model wrote; ``"expected"`` replaces them by the
            mean of the model's distribution over the values the format can write, given the text before them
            (:class:`~kglightning.llm.confidence_readout.ConfidenceReadout`), which varies even when the greedy
            digits are always the training set's most frequent value.
        confidence_digits: decimals of the expected confidence and of its candidate values (the SFT data writes 2).
    """

    num_evidence: int = 3
    decoding: Decoding = "beam"
    max_new_tokens: int = 64
    confidence: Literal["stated", "expected"] = "stated"
    confidence_digits: int = 2

    def __post_init__(self) -> None:
        if self.num_evidence < 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"need num_evidence >= 1 and max_new_tokens >= 1, got {self.num_evidence}, {self.max_new_tokens}"
            )
        if self.decoding not in ("beam", "greedy"):
            raise ValueError(f"decoding must be 'beam' or 'greedy', got {self.decoding!r}")
        if self.confidence not in ("stated", "expected"):
            raise ValueError(f"confidence must be 'stated' or 'expected', got {self.confidence!r}")
        if not 0 <= self.confidence_digits <= 3:
            raise ValueError(f"confidence_digits must be in 0..3, got {self.confidence_digits}")


# the typed components are hyperparameters, so checkpoints hold them: let torch.load(weights_only=True) rebuild them
torch.serialization.add_safe_globals([LoRASettings, EvidenceGeneration, ProxyPrompt])


class ProxySFT(L.LightningModule):
    """A LoRA-tuned causal LM that generates constrained relational paths with a confidence.

    Validation and test log the loss and, on the first ``val_generate_batches`` batches, the *evidence validity
    rate*: the share of greedy generations that :func:`~kglightning.evidence.format.parse_evidence` reads as
    well-formed evidence with a confidence and nothing malformed, and ``evidence_malformed``, the number of issues
    (malformed blocks, plus texts without any ``<PATH>``). ``predict`` generates
    ``num_evidence`` sequences per question (beam search) or one (greedy) and returns, per question, the parsed
    evidence, the raw texts and the parse counts.

    Args:
        model: the base model: a local folder, a ``.gguf`` file, or ``"bundled:smollm2"`` (SmolLM2-135M-Instruct).
        gguf_file: GGUF file name inside the ``model`` folder.
        dtype: weight dtype (GGUF weights are dequantised to it).
        lora: the adapter's shape (:class:`~kglightning.llm.lora.LoRASettings`).
        adapter_path: a PEFT adapter folder (from :meth:`save_adapter`) to start from; its own LoRA config then
            replaces ``lora``.
        save_adapter_dir: where to write the adapter at the end of ``fit`` (``None``: not written).
        export: which adapter weights it writes: ``"best"`` (the best checkpoint's, by the checkpoint callback's
            monitor; the last step's when no checkpoint is chosen by a monitored metric) or ``"last"``.
        optimizer: optimizer factory over the LoRA weights; default AdamW(lr=2e-5), the paper's SFT setting.
        generation: how evidence is generated at predict time (:class:`EvidenceGeneration`: K, beam or greedy,
            length).
        prompt_format: how prompts are rendered (:class:`~kglightning.datamodules.sft.ProxyPrompt`); the CLI links
            it to the data, and the DoublyCal pipeline renders its prompts with it.
        val_generate_batches: validation/test batches whose evidence prompts are also generated and parsed.
    """

    #: constructor arguments left out of the saved hyperparameters (callables, rebuilt from the config)
    hparams_ignore: ClassVar[tuple[str, ...]] = ("optimizer",)

    def __init__(
        self,
        model: str = BUNDLED_SMOLLM2,
        gguf_file: str | None = None,
        dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        lora: LoRASettings = LoRASettings(),
        adapter_path: str | None = None,
        save_adapter_dir: str | None = None,
        optimizer: OptimizerCallable | None = None,
        generation: EvidenceGeneration = EvidenceGeneration(),
        prompt_format: ProxyPrompt = ProxyPrompt(),
        val_generate_batches: int = 2,
        export: ExportChoice = "best",
    ) -> None:
        super().__init__()
        if export not in ("best", "last"):
            raise ValueError(f"export must be 'best' or 'last', got {export!r}")
        self.export = export
        from peft import PeftModel, get_peft_model

        self.save_hyperparameters(ignore=list(self.hparams_ignore))
        self.optimizer = optimizer
        self.generation = generation
        self.num_evidence = self.generation.num_evidence
        self.decoding = self.generation.decoding
        self.max_new_tokens = self.generation.max_new_tokens
        self.prompt_format = prompt_format
        self.val_generate_batches = val_generate_batches
        self.save_adapter_dir = save_adapter_dir
        self.tokenizer = sft_tokenizer(model, gguf_file)
        base = load_causal_lm(model, gguf_file, dtype, self.tokenizer.pad_token_id)
        if adapter_path is not None:
            if not (Path(adapter_path) / "adapter_config.json").is_file():
                raise FileNotFoundError(
                    f"adapter_path {adapter_path!r} is not a PEFT adapter folder (no adapter_config.json); train one "
                    "with `python -m kglightning fit --config configs/proxy_sft.yaml` (it writes save_adapter_dir)"
                )
            self.model = PeftModel.from_pretrained(base, adapter_path, is_trainable=True)
        else:
            self.model = get_peft_model(base, lora.to_peft())
        self.model.train()  # from_pretrained leaves eval mode; a new module starts in train mode like any nn.Module
        self.valid_rate = torch.nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})
        self.malformed = torch.nn.ModuleDict({s: SumMetric() for s in ("val", "test")})
        self.predict_stats = ParseStats()
        self.readout: ConfidenceReadout | None = None
        if generation.confidence == "expected":
            self.readout = ConfidenceReadout(self.tokenizer, generation.confidence_digits)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor | None = None) -> Any:
        """The causal LM's output (with ``loss`` over the tokens whose label is not ``-100`` when ``labels``)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    def _loss(self, batch: dict[str, Any]) -> Tensor:
        return self(batch["input_ids"], batch["attention_mask"], batch["labels"]).loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, batch_size=batch["input_ids"].shape[0], prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def _eval_step(self, batch: dict[str, Any], batch_idx: int, stage: Literal["val", "test"]) -> None:
        size = batch["input_ids"].shape[0]
        self.log(f"{stage}/loss", self._loss(batch), batch_size=size, prog_bar=True, sync_dist=True)
        prompt = batch["prompt"]
        if batch_idx >= self.val_generate_batches:
            return
        if prompt["input_ids"].shape[0]:  # a batch of QA examples only has no evidence prompt
            texts, _ = self.generate_texts(prompt["input_ids"], prompt["attention_mask"], "greedy")
            results = [parse_evidence(t, require_confidence=True) for t in texts]
            valid = torch.tensor([float(r.ok) for r in results], device=self.device)
            self.valid_rate[stage].update(valid)
            issues = float(sum(len(r.issues) for r in results))
            self.malformed[stage].update(torch.tensor(issues, device=self.device))
        # logged by every process, also one without prompts here: under DDP the metrics' epoch-end sync is collective
        self.log(f"{stage}/evidence_valid_rate", self.valid_rate[stage], prog_bar=True)
        self.log(f"{stage}/evidence_malformed", self.malformed[stage])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, batch_idx, "test")

    @torch.no_grad()
    def generate_texts(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        decoding: Decoding | None = None,
        tries: Sequence[KGTrie] | None = None,
    ) -> tuple[list[str], list[float] | None]:
        """Generate from left-padded prompts.

        Args:
            input_ids: ``(B, L)`` left-padded prompt ids.
            attention_mask: ``(B, L)``.
            decoding: ``"beam"`` or ``"greedy"``; default the module's ``decoding``.
            tries: one :class:`~kglightning.llm.trie.KGTrie` per prompt: every ``<PATH>`` block is then constrained
                to the prompt's KG (graph-constrained decoding, failing closed; confidence digits stay free).

        Returns:
            The ``B * n`` completion texts, question by question (``n = num_evidence`` for beam search, else 1),
            and their beam log-scores (``None`` for greedy decoding).
        """
        from transformers import GenerationConfig

        beam = (decoding or self.decoding) == "beam"
        n = self.num_evidence if beam else 1
        eos = self.tokenizer.eos_token_id
        config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            num_beams=n,
            num_return_sequences=n,
            early_stopping=n > 1,
            eos_token_id=eos,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.model.generation_config.bos_token_id,
            return_dict_in_generate=True,
            output_scores=beam and n > 1,
        )
        out = self.run_generate(input_ids, attention_mask, config, tries)
        new = out.sequences[:, input_ids.shape[1] :].tolist()
        if self.readout is not None:
            prompts = [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
            texts = self.rewrite_confidences(prompts, new)
        else:
            texts = [self.tokenizer.decode(row, skip_special_tokens=True) for row in new]
        scores = getattr(out, "sequences_scores", None)
        return texts, None if scores is None else [float(s) for s in scores.float().cpu()]

    @torch.no_grad()
    def rewrite_confidences(self, prompts: Sequence[Sequence[int]], generated: Sequence[Sequence[int]]) -> list[str]:
        """Decode ``generated`` (``len(generated) / len(prompts)`` sequences per prompt, in order) with each block's
        confidence read out as its expected value (``generation.confidence="expected"``)."""
        readout = self.readout or ConfidenceReadout(self.tokenizer, self.generation.confidence_digits)
        n = len(generated) // max(len(prompts), 1)
        was_training = self.model.training
        self.model.eval()
        try:
            return [readout.rewrite(self.model, prompts[i // n], row) for i, row in enumerate(generated)]
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def run_generate(
        self, input_ids: Tensor, attention_mask: Tensor, config: Any, tries: Sequence[KGTrie] | None = None
    ) -> Any:
        """``model.generate`` in eval mode (the mode is restored after), through one KG-Trie per prompt if given.

        Args:
            input_ids: ``(B, L)`` left-padded prompt ids.
            attention_mask: ``(B, L)``.
            config: the ``transformers.GenerationConfig``.
            tries: one :class:`~kglightning.llm.trie.KGTrie` per prompt, or ``None``.
        """
        from transformers import LogitsProcessorList

        processors = None
        if tries is not None:
            if len(tries) != input_ids.shape[0]:
                raise ValueError(f"need one trie per prompt: got {len(tries)} tries for {input_ids.shape[0]} prompts")
            processors = LogitsProcessorList([KGTrieLogitsProcessor(list(tries))])
        was_training = self.model.training
        self.model.eval()
        try:
            return generate_exactly(
                self.model,
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=processors,
            )
        finally:
            self.model.train(was_training)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """Per question: ``evidence`` (well-formed blocks, each with its sequence ``rank`` and beam ``score``), the
        ``raw`` texts, their ``issues`` and ``parse`` counts; ``id``, ``question`` and ``answer`` pass through.
        A batch with ``tries`` (:class:`~kglightning.datamodules.ProxyGRPODataModule` with ``trie`` set) is decoded
        through them."""
        texts, scores = self.generate_texts(batch["input_ids"], batch["attention_mask"], tries=batch.get("tries"))
        n = len(texts) // max(len(batch["id"]), 1)
        out = []
        for q, qid in enumerate(batch["id"]):
            raw = texts[q * n : (q + 1) * n]
            stats = ParseStats()
            parsed: list[ParseResult] = [parse_evidence(t, require_confidence=True, stats=stats) for t in raw]
            self.predict_stats.merge(stats)
            evidence = [
                {
                    "relations": list(z.relations),
                    "constraint": None if z.constraint is None else list(z.constraint),
                    "confidence": z.confidence,
                    "rank": k,
                    "score": None if scores is None else scores[q * n + k],
                }
                for k, result in enumerate(parsed)
                for z in result.evidence
            ]
            out.append(
                {
                    "id": qid,
                    "question": batch["question"][q],
                    "answer": batch["answer"][q],
                    "evidence": evidence,
                    "raw": raw,
                    "issues": [r.issues for r in parsed],
                    "parse": stats.as_dict(),
                }
            )
        return out

    def on_predict_start(self) -> None:
        self.predict_stats = ParseStats()
        if self.readout is not None:
            self.readout.reset()

    def on_predict_end(self) -> None:
        rank_zero_info(f"proxy evidence: {self.predict_stats}")
        if self.readout is not None:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(self.readout.counts.items())) or "no blocks"
            rank_zero_info(f"expected-confidence readout: {counts}")

    # adapter and checkpoints

    def save_adapter(self, directory: str) -> None:
        """Write the PEFT adapter (``adapter_config.json`` and weights) to ``directory``; reload it with
        ``ProxySFT(model=..., adapter_path=directory)``.

        Args:
            directory: the output folder (created if missing).
        """
        main = self._trainer is None or self.trainer.is_global_zero
        # only the trained adapter (a GRPO policy also holds its frozen "reference" copy)
        self.model.save_pretrained(directory, is_main_process=main, selected_adapters=["default"])

    def on_fit_end(self) -> None:
        if self.save_adapter_dir is not None and self.trainer.is_global_zero:  # one process reads the checkpoint
            with exported_weights(self, self.export) as source:
                self.save_adapter(self.save_adapter_dir)
            rank_zero_info(f"saved the LoRA adapter ({source}) to {self.save_adapter_dir}")

    def _trainable_keys(self) -> set[str]:
        return {name for name, p in self.named_parameters() if p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the trainable (LoRA) weights: the frozen base is rebuilt from ``model`` on load."""
        keep = self._trainable_keys()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Complete a LoRA-only checkpoint with the frozen base weights just loaded, so loading stays strict."""
        saved = checkpoint["state_dict"]
        missing = self._trainable_keys() - set(saved)
        if missing:
            raise KeyError(f"the checkpoint lacks {len(missing)} LoRA weights, e.g. {sorted(missing)[:3]}")
        checkpoint["state_dict"] = {**{k: v for k, v in self.state_dict().items() if k not in saved}, **saved}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer is None:
            return torch.optim.AdamW(params, lr=2e-5)
        return self.optimizer(params)
