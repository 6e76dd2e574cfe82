"""kglightning: PyTorch Lightning toolkit for trustworthy question answering over knowledge graphs with LLMs."""

__version__ = "0.1.0"
