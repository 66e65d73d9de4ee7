"""Errors of the export side. Each carries a one-line message meant for the user, not a traceback."""

from __future__ import annotations


class ExportError(Exception):
    """The export cannot go on; `bertserve export` prints the message and exits 1, writing nothing."""


class CheckpointError(ExportError):
    """A checkpoint directory that this BERT cannot load: bad config, corrupt weights, keys that do not fit."""


class VerificationError(ExportError):
    """An ONNX graph whose outputs differ from the PyTorch module's by more than the tolerance."""
