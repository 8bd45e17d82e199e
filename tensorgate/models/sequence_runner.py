"""The requests of a sequence model version: control tensors, implicit state, one turn at a time.

A request to a sequence model (``sequence_batching``) names its sequence (``sequence_id``,
``sequence_start``, ``sequence_end``: scheduling/sequences.py). Before it is queued, the server
adds the tensors the model declares but the client never sends: the control inputs (START, END,
READY, CORRID, in the datatypes and values the configuration gives, as Triton fills them) and each
state input, the sequence's last state output (or the initial state on its first request). After
it ran, the state outputs are kept in the sequence table for the next request and taken out of the
response. Requests of different sequences share batches in the version's scheduler as any
requests do; the requests of one sequence take turns, so a batch never holds two of them.

Strategies (Triton's names): ``oldest`` lets any instance run any sequence's next request (the
state travels with it), up to ``max_candidate_sequences`` open at once; ``direct`` binds each
sequence to one slot of one instance for its life (``max_batch_size`` slots per instance), for a
model that also keeps state of its own per sequence. Either way the state lives in the table, so
a sequence outlives the instance that ran its last request: if that instance dies or leaves
rotation, the next request runs on another one with the same state (``direct`` rebinds it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorgate.backends.sequence_tensors import triton_datatype
from tensorgate.config.model_config import SequenceBatching
from tensorgate.errors import InvalidInput, ModelLoadError, TensorgateError
from tensorgate.instances.base import Instance
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import VersionMetrics
from tensorgate.scheduling.scheduler import Scheduler
from tensorgate.scheduling.sequences import Sequence, SequenceFlags, SequenceTable, sequence_flags
from tensorgate.types import Array, DataType, InferRequest, InferResponse, TensorSpec

if TYPE_CHECKING:
    from tensorgate.models.validation import TensorRules

log = logging.getLogger(__name__)

CONTROL_KINDS = {
    "CONTROL_SEQUENCE_START": "start",
    "CONTROL_SEQUENCE_END": "end",
    "CONTROL_SEQUENCE_READY": "ready",
    "CONTROL_SEQUENCE_CORRID": "corrid",
}


@dataclass(frozen=True, slots=True)
class Control:
    name: str
    kind: str  # start, end, ready or corrid
    datatype: DataType
    false: Any = None
    true: Any = None


@dataclass(frozen=True, slots=True)
class State:
    input_name: str
    output_name: str
    datatype: DataType
    initial: Array  # one sequence's, without the batch dimension


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    controls: tuple[Control, ...]
    states: tuple[State, ...]
    direct: bool
    capacity: int  # sequences open at once on one version
    slots: int  # per instance (direct)
    idle_s: float
    batched: bool

    @property
    def hidden_inputs(self) -> frozenset[str]:
        """The model's inputs the server fills: never the client's to send."""
        return frozenset([c.name for c in self.controls] + [s.input_name for s in self.states])

    @property
    def hidden_outputs(self) -> frozenset[str]:
        return frozenset(s.output_name for s in self.states)

    def warmup_tensors(self, rows: int) -> dict[str, Array]:
        """Controls and initial state for a warm-up sample of ``rows`` rows: each row a sequence's
        only request (START, END and READY true, correlation id 1)."""
        shape = (rows, 1) if self.batched else (1,)
        tensors: dict[str, Array] = {}
        for control in self.controls:
            if control.kind == "corrid":
                value: Any = b"1" if control.datatype is DataType.BYTES else 1
                tensors[control.name] = np.full(shape, value, dtype=control.datatype.numpy)
            else:
                tensors[control.name] = np.full(shape, control.true, dtype=control.datatype.numpy)
        for state in self.states:
            initial = state.initial
            tensors[state.input_name] = np.repeat(initial[np.newaxis], rows, axis=0) if self.batched else initial
        return tensors


def _control(name: str, control: Any) -> Control:
    kind = CONTROL_KINDS[control.kind]
    if kind == "corrid":
        return Control(name, kind, triton_datatype(control.data_type))
    if control.int32_false_true:
        return Control(name, kind, DataType.INT32, *control.int32_false_true)
    if control.fp32_false_true:
        return Control(name, kind, DataType.FP32, *control.fp32_false_true)
    return Control(name, kind, DataType.BOOL, *control.bool_false_true)


def _initial_state(state: Any, version_dir: Path | None) -> Array:
    datatype = triton_datatype(state.data_type)
    if datatype is DataType.BYTES:
        raise ModelLoadError(f"state '{state.input_name}': BYTES state is not supported; use a numeric datatype")
    if not state.initial_state:
        return np.zeros(tuple(state.dims), dtype=datatype.numpy)
    initial = state.initial_state[0]
    dims = tuple(initial.dims)
    if initial.zero_data:
        return np.zeros(dims, dtype=datatype.numpy)
    where = (version_dir or Path(".")) / "initial_state" / initial.data_file
    try:
        raw = where.read_bytes()
    except OSError as exc:
        message = f"state '{state.input_name}': cannot read its initial_state data_file {where}: {exc}"
        raise ModelLoadError(message) from None
    expected = int(np.prod(dims)) * datatype.numpy.itemsize
    if len(raw) != expected:
        raise ModelLoadError(
            f"state '{state.input_name}': {where} holds {len(raw)} bytes, its dims {list(dims)} of "
            f"{datatype.value} need {expected}"
        )
    return np.frombuffer(raw, dtype=datatype.numpy).reshape(dims).copy()


def sequence_settings(
    config: SequenceBatching, max_batch_size: int, instances: int, version_dir: Path | None
) -> SequenceSettings:
    slots = max(1, max_batch_size)
    direct = config.oldest is None
    capacity = slots * instances if direct else config.oldest.max_candidate_sequences  # type: ignore[union-attr]
    return SequenceSettings(
        controls=tuple(_control(c.name, c.control[0]) for c in config.control_input),
        states=tuple(
            State(s.input_name, s.output_name, triton_datatype(s.data_type), _initial_state(s, version_dir))
            for s in config.state
        ),
        direct=direct,
        capacity=capacity,
        slots=slots,
        idle_s=config.max_sequence_idle_microseconds / 1e6,
        batched=max_batch_size > 0,
    )


def check_model_tensors(
    model: str,
    settings: SequenceSettings,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
) -> None:
    """The control and state tensors must be the model's own, in the datatypes the configuration
    gives them (a Python model's come from the configuration: backends/sequence_tensors.py)."""
    by_input = {s.name: s for s in inputs}
    by_output = {s.name: s for s in outputs}
    for control in settings.controls:
        if control.name not in by_input:
            raise ModelLoadError(f"model '{model}': control input '{control.name}' is not one of the model's inputs")
        spec = by_input.get(control.name)
        if spec is not None and spec.datatype is not control.datatype:
            raise ModelLoadError(
                f"model '{model}': control input '{control.name}' is {spec.datatype.value} in the model but "
                f"{control.datatype.value} in sequence_batching"
            )
    for state in settings.states:
        for name, table in ((state.input_name, by_input), (state.output_name, by_output)):
            spec = table.get(name)
            if spec is None:
                raise ModelLoadError(f"model '{model}': state tensor '{name}' is not one of the model's")
            if spec is not None and spec.datatype is not state.datatype:
                raise ModelLoadError(
                    f"model '{model}': state tensor '{name}' is {spec.datatype.value} in the model but "
                    f"{state.datatype.value} in sequence_batching"
                )


class SequenceRunner:
    """Runs one sequence model version's requests through its scheduler, one turn per sequence."""

    def __init__(
        self,
        model: str,
        servable: Any,
        table: SequenceTable,
        settings: SequenceSettings,
        scheduler: Scheduler,
        pool: InstancePool,
        rules: TensorRules,
        metrics: VersionMetrics,
    ) -> None:
        self.model = model
        self._servable = servable
        self.table = table
        self.settings = settings
        self._scheduler = scheduler
        self._pool = pool
        self._rules = rules
        self._metrics = metrics
        self._hidden_outputs = settings.hidden_outputs
        self._state_outputs = tuple(s.output_name for s in settings.states)
        scheduler.affinity = settings.direct

    def continues_here(self, request: InferRequest) -> bool:
        """Whether the request continues a sequence open on this version (served while it drains)."""
        try:
            flags = sequence_flags(self.model, request.parameters)
        except InvalidInput:
            return False
        sequence = self.table.get(flags.id)
        return not flags.start and sequence is not None and sequence.servable is self._servable

    async def infer(self, request: InferRequest) -> InferResponse:
        flags = sequence_flags(self.model, request.parameters)
        rows, key = self._rules.check_inputs(request.inputs)
        self._rules.check_outputs(request.outputs)
        if self.settings.batched and rows != 1:
            raise InvalidInput(
                f"inference request to model '{self.model}' must specify batch-size 1 due to requirements of "
                "sequence batcher"
            )
        sequence = self._begin(flags)
        sequence.pending += 1
        try:
            async with sequence.turn:
                if sequence.closed:  # ended while this request waited for its turn
                    raise InvalidInput(f"sequence {flags.id} of model '{self.model}' {sequence.closed}")
                return await self._run(request, flags, sequence, key)
        except TensorgateError:
            if flags.start and sequence.pending == 1 and not sequence.closed and not sequence.state:
                # Its first request failed: the sequence never began, and its START may come again.
                self.table.close(sequence, "failed", "failed on its first request")
            raise
        finally:
            sequence.pending -= 1
            self.table.touch(sequence)

    def _begin(self, flags: SequenceFlags) -> Sequence:
        if not flags.start:
            return self.table.find(flags)
        sequence = self.table.open(flags, self._servable, self.settings.capacity)
        self._metrics.sequence_started()
        if self.settings.direct:
            sequence.instance = self._free_slot(sequence)
        return sequence

    def _free_slot(self, sequence: Sequence) -> Instance | None:
        """The instance in rotation with the fewest sequences bound to it (direct); None when none
        is in rotation (the scheduler then runs the request on whichever comes back first)."""
        bound: dict[Instance, int] = {i: 0 for i in self._pool.instances if i.available}
        for other in self.table.sequences_on(self._servable):
            if other is not sequence and other.instance in bound:
                bound[other.instance] += 1
        if not bound:
            return None
        return min(bound, key=lambda i: bound[i])

    async def _run(self, request: InferRequest, flags: SequenceFlags, sequence: Sequence, key: Any) -> InferResponse:
        if self.settings.direct and (sequence.instance is None or not sequence.instance.available):
            moved = self._free_slot(sequence)
            if sequence.instance is not None and moved is not None:
                log.warning(
                    "sequence %s of %s moves from instance %s (out of rotation) to %s with its state",
                    sequence.id,
                    self.model,
                    sequence.instance.name,
                    moved.name,
                )
            sequence.instance = moved
        inputs = dict(request.inputs)
        inputs.update(self._controls(flags))
        key = list(key)
        batched = self.settings.batched
        for state in self.settings.states:
            value = sequence.state.get(state.input_name)
            if value is None:
                value = state.initial
            inputs[state.input_name] = value[np.newaxis] if batched else value
            key.append(value.shape)
        outputs = request.outputs
        if outputs:  # the state outputs are the server's, whatever the client asked for
            outputs = (*outputs, *(name for name in self._state_outputs if name not in outputs))
        internal = InferRequest(
            request.model,
            inputs,
            request.version,
            outputs,
            request.parameters,
            request.priority,
            request.timeout_s,
            request.id,
            request.request_id,
            request.traceparent,
            request.tenant,
        )
        response = await self._scheduler.submit(internal, 1, tuple(key), sequence.instance)
        produced = response.outputs
        for state in self.settings.states:
            value = produced.get(state.output_name)
            if value is None:
                raise InvalidInput(f"model '{self.model}' returned no state output '{state.output_name}'")
            sequence.state[state.input_name] = np.array(value[0] if batched else value, copy=True)
        if flags.end:
            self.table.close(sequence, "end", "has ended (its last request carried sequence_end)")
        wanted = request.outputs
        if wanted:
            kept = {name: produced[name] for name in wanted}
        else:
            kept = {name: array for name, array in produced.items() if name not in self._hidden_outputs}
        return InferResponse(
            response.model,
            response.version,
            kept,
            response.id,
            response.parameters,
            queue_s=response.queue_s,
            compute_s=response.compute_s,
        )

    def _controls(self, flags: SequenceFlags) -> dict[str, Array]:
        shape = (1, 1) if self.settings.batched else (1,)
        tensors: dict[str, Array] = {}
        for control in self.settings.controls:
            if control.kind == "corrid":
                tensors[control.name] = self._corrid(flags, control, shape)
                continue
            on = {"start": flags.start, "end": flags.end, "ready": True}[control.kind]
            tensors[control.name] = np.full(shape, control.true if on else control.false, control.datatype.numpy)
        return tensors

    def _corrid(self, flags: SequenceFlags, control: Control, shape: tuple[int, ...]) -> Array:
        if control.datatype is DataType.BYTES:
            return np.full(shape, str(flags.id).encode(), dtype=object)
        if isinstance(flags.id, str):
            raise InvalidInput(
                f"sequence id '{flags.id}' is a string, but model '{self.model}' takes its CORRID control as "
                f"{control.datatype.value}: send an integer sequence_id"
            )
        info = np.iinfo(control.datatype.numpy)
        if not info.min <= flags.id <= info.max:
            raise InvalidInput(
                f"sequence id {flags.id} does not fit model '{self.model}''s CORRID control ({control.datatype.value})"
            )
        return np.full(shape, flags.id, control.datatype.numpy)

    async def drain(self, timeout_s: float) -> None:
        """A retired version: serve its open sequences to their end (or ``timeout_s``)."""
        cut = await self.table.wait_drained(self._servable, timeout_s)
        if cut:
            log.warning("model %s: %d sequence(s) were ended when their version was unloaded", self.model, cut)
