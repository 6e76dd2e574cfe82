"""``kglightning`` / ``python -m kglightning``: :func:`main` (:mod:`.entry`, which imports neither Lightning nor torch)
and, imported on first use, :class:`KGLightningCLI` and the helpers of the trainer's subcommands (:mod:`.trainer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kglightning.cli.entry import USER_INPUT_ERRORS, main, top_level_parser
from kglightning.cli.names import DESCRIPTION, EXTRA_SUBCOMMANDS, PROG, TRAINER_SUBCOMMANDS, version_string

if TYPE_CHECKING:
    from kglightning.cli.trainer import KGLightningCLI, configured, default_t_max

_TRAINER_NAMES = ("KGLightningCLI", "configured", "default_t_max")

__all__ = [
    "DESCRIPTION",
    "EXTRA_SUBCOMMANDS",
    "PROG",
    "TRAINER_SUBCOMMANDS",
    "USER_INPUT_ERRORS",
    "KGLightningCLI",
    "configured",
    "default_t_max",
    "main",
    "top_level_parser",
    "version_string",
]


def __getattr__(name: str) -> Any:
    """``from kglightning.cli import KGLightningCLI`` (to subclass it) imports Lightning then, not before."""
    if name in _TRAINER_NAMES:
        from kglightning.cli import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
