"""Lightning callbacks."""

from kglightning.callbacks.prediction_writer import JsonlPredictionWriter

__all__ = ["JsonlPredictionWriter"]
