"""Reconciling what a model declares with what its configuration says.

The model's own signature is the truth; ``config.yaml`` may narrow it (a fixed dimension where the
model is dynamic) but never contradict it. Whether requests can share a batch follows from the
model: a dynamic leading dimension on every input and output makes it batchable; a fixed one means
one request per call, whatever the configuration asks (with a warning, not a rejection).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tensorgate.config.model_config import DEFAULT_MAX_BATCH_SIZE, DynamicBatching, ModelConfig, TensorConfig
from tensorgate.errors import ModelLoadError
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.types import DataType, TensorSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResolvedSpecs:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int  # 0: no batch axis
    batch: BatchSettings
    # Ragged batching (config ``ragged``): the inputs whose dynamic axes past the batch axis may differ
    # within a batch, and per output that follows one, (input, the axes cut back to each request's size).
    ragged_inputs: frozenset[str] = frozenset()
    ragged_outputs: tuple[tuple[str, str, tuple[int, ...]], ...] = ()


def _narrow(model_spec: TensorSpec, declared: TensorConfig, where: str) -> TensorSpec:
    try:
        datatype = DataType.parse(declared.datatype)
    except ValueError as exc:
        raise ModelLoadError(f"{where}: {exc}") from exc
    if datatype is not model_spec.datatype:
        raise ModelLoadError(
            f"{where}: datatype {datatype.value} contradicts the model, which declares {model_spec.datatype.value}"
        )
    return TensorSpec(model_spec.name, datatype, _merge_shape(model_spec.shape, tuple(declared.shape), where))


def _merge_shape(model: tuple[int, ...], declared: tuple[int, ...], where: str) -> tuple[int, ...]:
    if model and len(model) != len(declared):
        raise ModelLoadError(f"{where}: shape {list(declared)} has rank {len(declared)}, the model has {list(model)}")
    if not model:
        return declared
    merged = []
    for have, want in zip(model, declared, strict=True):
        if have != -1 and want != -1 and have != want:
            raise ModelLoadError(f"{where}: shape {list(declared)} contradicts the model's {list(model)}")
        merged.append(want if have == -1 else have)
    return tuple(merged)


def _apply(
    model_specs: tuple[TensorSpec, ...], declared: list[TensorConfig] | None, what: str
) -> tuple[TensorSpec, ...]:
    if not declared:
        return model_specs
    by_name = {s.name: s for s in model_specs}
    unknown = [t.name for t in declared if t.name not in by_name]
    if unknown:
        raise ModelLoadError(f"config.yaml {what} {unknown} are not in the model, which has {sorted(by_name)}")
    narrowed = {t.name: _narrow(by_name[t.name], t, f"config.yaml {what} '{t.name}'") for t in declared}
    return tuple(narrowed.get(s.name, s) for s in model_specs)


def resolve_specs(
    model: str,
    model_inputs: tuple[TensorSpec, ...],
    model_outputs: tuple[TensorSpec, ...],
    config: ModelConfig,
    request_input_shape: tuple[int, ...] | None = None,
) -> ResolvedSpecs:
    inputs = _apply(model_inputs, config.inputs, "inputs")
    outputs = _apply(model_outputs, config.outputs, "outputs")

    batchable = all(s.shape and s.shape[0] == -1 for s in inputs + outputs) and bool(inputs)
    asked = config.max_batch_size
    if asked is None and config.dynamic_batching is not None:
        asked = config.dynamic_batching.max_batch_size
    if not batchable:
        if config.dynamic_batching is not None or config.sequence_batching is not None or (asked or 0) > 0:
            log.warning(
                "model %s has a fixed batch dimension, so requests cannot share a call: serving it unbatched "
                "(one request per execution) although its configuration asks for batching",
                model,
            )
        max_batch_size = 0
    else:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if asked is None else asked

    if request_input_shape is not None and inputs:
        first = inputs[0]
        shape = request_input_shape
        # input_shape is one request's shape; on a batchable model its leading dim is that request's rows.
        tail = shape[1:] if max_batch_size > 0 else shape
        model_tail = first.shape[1:] if max_batch_size > 0 else first.shape
        merged = _merge_shape(model_tail, tail, f"input_shape {list(shape)} for input '{first.name}'")
        full = (-1, *merged) if max_batch_size > 0 else merged
        inputs = (TensorSpec(first.name, first.datatype, full), *inputs[1:])

    db = config.dynamic_batching
    sb = config.sequence_batching
    if sb is not None:  # the sequence batcher batches requests of different sequences
        strategy = sb.oldest or sb.direct
        db = DynamicBatching(
            max_queue_delay_ms=(strategy.max_queue_delay_microseconds / 1000.0) if strategy else 0.0,
            preferred_batch_sizes=list(sb.oldest.preferred_batch_size) if sb.oldest else [],
        )
    batching = db is not None and max_batch_size > 0
    # max_batch_size bounds one call of the model (and so one request); dynamic_batching's own
    # max_batch_size, when both are given, bounds the batches the scheduler forms (config checks it is not above).
    batch_rows = max_batch_size
    if db is not None and db.max_batch_size is not None and max_batch_size > 0:
        batch_rows = min(db.max_batch_size, max_batch_size)
    preferred = tuple(p for p in (db.preferred_batch_sizes if db else []) if p <= max(batch_rows, 1))
    settings = BatchSettings(
        max_rows=batch_rows,
        batching=batching,
        max_queue_delay_s=(db.max_queue_delay_ms / 1000.0) if db else 0.0,
        preferred_rows=preferred,
        adaptive_delay=db.adaptive_delay if db else True,
    )
    ragged_inputs, ragged_outputs = _ragged(model, inputs, outputs, config, max_batch_size)
    return ResolvedSpecs(inputs, outputs, max_batch_size, settings, ragged_inputs, ragged_outputs)


def _ragged(
    model: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    config: ModelConfig,
    max_batch_size: int,
) -> tuple[frozenset[str], tuple[tuple[str, str, tuple[int, ...]], ...]]:
    """Check the ``ragged`` keys against the model's own shapes; the inputs, and each output's cuts."""
    pads = config.ragged_pads()
    if not pads:
        return frozenset(), ()
    if max_batch_size == 0:
        log.warning("model %s declares ragged inputs but is served unbatched: each request runs alone", model)
        return frozenset(), ()
    by_name = {s.name: s for s in inputs}
    for name in pads:
        spec = by_name.get(name)
        if spec is None:
            raise ModelLoadError(f"config.yaml input '{name}' is ragged but the model has no such input")
        if -1 not in spec.shape[1:]:
            raise ModelLoadError(
                f"config.yaml input '{name}' is ragged, but the model fixes every axis past the batch axis "
                f"({list(spec.shape)}): requests could not differ in any"
            )
    cuts = []
    produced = {s.name: s for s in outputs}
    for tensor in config.outputs or []:
        if tensor.ragged is None or tensor.ragged.input is None:
            continue
        source, output = by_name[tensor.ragged.input], produced[tensor.name]
        axes = tuple(
            axis
            for axis in range(1, min(len(output.shape), len(source.shape)))
            if output.shape[axis] == -1 and source.shape[axis] == -1
        )
        if not axes:
            raise ModelLoadError(
                f"config.yaml output '{tensor.name}' follows ragged input '{source.name}', but no dynamic axis "
                f"of {list(output.shape)} matches one of {list(source.shape)}"
            )
        cuts.append((tensor.name, source.name, axes))
    return frozenset(pads), tuple(cuts)


def without(specs: ResolvedSpecs, inputs: frozenset[str], outputs: frozenset[str]) -> ResolvedSpecs:
    """The specs a client sees: a sequence model's control and state tensors are the server's."""
    return ResolvedSpecs(
        tuple(s for s in specs.inputs if s.name not in inputs),
        tuple(s for s in specs.outputs if s.name not in outputs),
        specs.max_batch_size,
        specs.batch,
        specs.ragged_inputs,
        specs.ragged_outputs,
    )
