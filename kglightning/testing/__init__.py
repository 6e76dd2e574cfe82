"""Helpers for tests and benchmarks: tiny local models (nothing is downloaded) and the default-device trap.

:func:`tiny_bpe_tokenizer` and :func:`tiny_llama` build small seeded models (:mod:`kglightning.testing.models`);
:class:`DeviceTrap` makes CPU runs fail where a GPU run would (:mod:`kglightning.testing.device_trap`).
"""

from kglightning.testing.device_trap import DeviceTrap, DeviceTrapCallback
from kglightning.testing.models import CHATML_SPECIAL_TOKENS, quiet_trainer, tiny_bpe_tokenizer, tiny_llama

__all__ = [
    "CHATML_SPECIAL_TOKENS",
    "DeviceTrap",
    "DeviceTrapCallback",
    "quiet_trainer",
    "tiny_bpe_tokenizer",
    "tiny_llama",
]
