"""Lightning callbacks."""

from kglightning.callbacks.conformal import ConformalCallback, ConformalScorer, ConformalScores
from kglightning.callbacks.model_checkpoint import ModelCheckpoint
from kglightning.callbacks.prediction_writer import JsonlPredictionWriter
from kglightning.callbacks.selection import SelectionCallback

__all__ = [
    "ConformalCallback",
    "ConformalScorer",
    "ConformalScores",
    "JsonlPredictionWriter",
    "ModelCheckpoint",
    "SelectionCallback",
]
