"""The public base class for models written in Python (``backend: python``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorgate.types import Array


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a Python model learns about itself at load time."""

    name: str
    version: int
    directory: Path
    device: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    instance: str = ""  # this instance's name: one per instance of the version, as in the metrics


class ModelError(Exception):
    """Raise it from ``execute`` to refuse a request with a message meant for the client (an input
    the model cannot use): the client gets 500 with this message. Any other exception's message
    stays in the server log (it may hold paths or data), and the client gets a generic one."""


class PythonModel:
    """Derive from this in ``<version>/model.py``.

    ``load`` runs once per instance before any request; ``execute`` runs one batch at a time (inputs
    and outputs are numpy arrays keyed by tensor name, batch on axis 0 when the model batches);
    ``unload`` runs once at shutdown. Model code comes from the repository and is trusted; request
    data reaches it only as arrays.
    """

    def load(self, context: ModelContext) -> None:
        """Prepare the model (read weights, build state). Raise to fail the load."""

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        raise NotImplementedError

    def unload(self) -> None:
        """Release what ``load`` took."""
