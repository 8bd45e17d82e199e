"""One model as the manager holds it: its source, its loaded versions and their states, its traffic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tensorgate.config.model_config import ModelConfig
from tensorgate.models.memory_budget import Residence
from tensorgate.models.servable import Servable, VersionStatus
from tensorgate.models.traffic import TrafficState
from tensorgate.repository.source import ModelSource
from tensorgate.scheduling.sequences import SequenceTable

# What a version was loaded from: its files' revision and the configuration that matters to a load.
LoadedFrom = tuple[str, ModelConfig]


@dataclass(slots=True)
class ModelEntry:
    source: ModelSource
    versions: dict[int, Servable] = field(default_factory=dict)  # serving (READY, or every instance down)
    statuses: dict[int, VersionStatus] = field(default_factory=dict)
    problem: str = ""
    # Counts for the server's readiness: every model found at startup, and a model added later from
    # the moment it first served. An unloaded model stops counting.
    wanted: bool = True
    traffic: TrafficState | None = None
    loaded: dict[int, LoadedFrom] = field(default_factory=dict)
    failed: dict[int, LoadedFrom] = field(default_factory=dict)
    generations: dict[int, int] = field(default_factory=dict)  # loads of each version number so far
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    residence: Residence = field(default_factory=Residence)  # memory residency (models/memory_budget.py)
    # A sequence model's open sequences across its versions (scheduling/sequences.py).
    sequences: SequenceTable | None = None

    def latest_ready(self) -> Servable | None:
        """The highest READY version; a loop rather than a sort, because every request asks."""
        best: Servable | None = None
        for version in self.versions.values():
            if version.ready and (best is None or version.version > best.version):
                best = version
        return best
