"""Shadow traffic: copies of served requests sent to a candidate version, its outputs compared.

The copy starts after the serving version has answered, in a task of its own, on the shadow
version's own scheduler and instances: the client's answer never waits for it, never shares a queue
slot with it, and never sees its errors. Copies in flight are capped (``max_inflight``); past the
cap a copy is shed rather than queued, so a slow shadow sheds before it can pile up work.

:func:`compare` is pure: an output matches when every element is within the relative
``tolerance`` (``|a - b| <= tolerance * |served|``; exact for strings and booleans) and, for an
output of classification shape (a float ``[batch, classes]`` tensor), every row's argmax is the
same. A changed class is a mismatch whatever the tolerance, and is also counted on its own, so
values that drift while every decision stays the same read as mismatches without class changes.

The copy holds its own inputs: a request's inputs may be views of a client's shared-memory region,
which the client may rewrite, or unregister, once it has its answer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from tensorgate.config.model_config import ShadowConfig
from tensorgate.errors import TensorgateError
from tensorgate.observability.metrics import Metrics
from tensorgate.types import Array, InferRequest, InferResponse

if TYPE_CHECKING:
    from tensorgate.models.servable import Servable

log = logging.getLogger(__name__)


def _classification_shaped(array: Array) -> bool:
    return array.ndim == 2 and array.shape[1] >= 2 and array.dtype.kind == "f"


def compare(served: Mapping[str, Array], shadow: Mapping[str, Array], tolerance: float) -> tuple[bool, bool, float]:
    """(whether any output differs beyond the tolerance, whether a classification output's argmax
    changed, the largest absolute difference over the numeric outputs)."""
    mismatch = changed_class = False
    largest = 0.0
    for name, a in served.items():
        b = shadow.get(name)
        if b is None or a.shape != b.shape:
            mismatch = True
            continue
        if a.dtype.kind in "OSUb" or b.dtype.kind in "OSUb":
            mismatch = mismatch or not np.array_equal(a, b)
            continue
        if not a.size:
            continue
        x, y = a.astype(np.float64), b.astype(np.float64)
        diff = np.abs(x - y)
        if not np.isnan(diff).all():
            largest = max(largest, float(np.nanmax(diff)))
        if not np.allclose(y, x, rtol=tolerance, atol=0.0, equal_nan=True):
            mismatch = True
        if _classification_shaped(a) and not np.array_equal(np.argmax(x, axis=1), np.argmax(y, axis=1)):
            mismatch = changed_class = True
    return mismatch, changed_class, largest


class Shadow:
    """One model's shadow: samples what the serving versions answered and replays it on ``version``."""

    def __init__(self, model: str, config: ShadowConfig, metrics: Metrics, rng: random.Random) -> None:
        self.model = model
        self.config = config
        self.version = config.version
        self._rng = rng
        self._inflight: set[asyncio.Task[None]] = set()
        v = str(config.version)
        self._outcomes = {o: metrics.shadow_requests.labels(model, v, o) for o in ("compared", "shed", "failed")}
        self._mismatches = metrics.shadow_mismatches.labels(model, v)
        self._class_changes = metrics.shadow_class_changes.labels(model, v)
        self._difference = metrics.shadow_difference.labels(model, v)
        self.compared = 0
        self.mismatched = 0
        self.class_changes = 0

    def offer(self, request: InferRequest, response: InferResponse, target: Servable | None) -> None:
        """Called with each answer a serving version gave; copies a sample of them to the shadow."""
        if self._rng.random() >= self.config.fraction:
            return
        if target is None or not target.ready or len(self._inflight) >= self.config.max_inflight:
            self._outcomes["shed"].inc()
            return
        inputs = {name: np.array(array, copy=True) for name, array in request.inputs.items()}
        copy = replace(request, inputs=inputs, version=target.version, outputs=tuple(response.outputs))
        task = asyncio.get_running_loop().create_task(self._replay(copy, response, target))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _replay(self, copy: InferRequest, response: InferResponse, target: Servable) -> None:
        try:
            answer = await target.infer(copy)
        except TensorgateError as exc:
            self._outcomes["failed"].inc()
            log.debug("shadow request to %s version %d failed: %s", self.model, self.version, exc.message)
            return
        except Exception:  # the boundary of this background task: never lost silently
            self._outcomes["failed"].inc()
            log.exception("shadow request to %s version %d failed", self.model, self.version)
            return
        mismatch, changed_class, largest = compare(response.outputs, answer.outputs, self.config.tolerance)
        self._outcomes["compared"].inc()
        self._difference.observe(largest)
        self.compared += 1
        if mismatch:
            self._mismatches.inc()
            self.mismatched += 1
        if changed_class:
            self._class_changes.inc()
            self.class_changes += 1

    def status(self) -> dict[str, object]:
        return {
            "version": self.version,
            "fraction": self.config.fraction,
            "compared": self.compared,
            "mismatched": self.mismatched,
            "class_changes": self.class_changes,
            "inflight": len(self._inflight),
        }

    async def aclose(self) -> None:
        for task in list(self._inflight):
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
