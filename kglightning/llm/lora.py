"""LoRA settings as one typed component, for every module that fine-tunes a causal LM with PEFT."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from peft import LoraConfig

__all__ = ["DEFAULT_TARGET_MODULES", "LoRASettings"]

DEFAULT_TARGET_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The attention projections of Llama-style models (SmolLM2, Llama, Qwen, Mistral)."""


@dataclass(frozen=True)
class LoRASettings:
    """A LoRA adapter's shape; a nested group in configs: ``lora: {r: 8, lora_alpha: 16}``.

    Args:
        r: rank of the update matrices.
        lora_alpha: scaling numerator (the update is scaled by ``lora_alpha / r``).
        lora_dropout: dropout on the adapter's input.
        target_modules: names of the modules that get an adapter (``None``: :data:`DEFAULT_TARGET_MODULES`).

    Example:
        >>> LoRASettings(r=4).to_peft().r
        4
    """

    r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"r must be >= 1, got {self.r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")

    def to_peft(self, task_type: str = "CAUSAL_LM") -> LoraConfig:
        """The ``peft.LoraConfig`` of these settings."""
        from peft import LoraConfig

        return LoraConfig(
            task_type=task_type,
            r=self.r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=list(self.target_modules or DEFAULT_TARGET_MODULES),
        )
