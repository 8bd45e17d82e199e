"""``backend: python``: a :class:`PythonModel` subclass loaded from ``<version>/model.py``, or a Triton
Python-backend model (a ``TritonPythonModel`` class; :mod:`tensorgate.backends.triton_python`)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from tensorgate.backends import triton_python
from tensorgate.backends.base import Backend, LoadSpec, ResponseSink, declared_specs
from tensorgate.backends.python_model import ModelContext, ModelError, PythonModel, ResponseSender
from tensorgate.backends.sequence_tensors import sequence_specs
from tensorgate.errors import ModelLoadError
from tensorgate.types import Array, DataType, TensorSpec


class PythonBackend(Backend):
    platform = "python"

    def __init__(self) -> None:
        self._model: PythonModel | None = None
        self._inputs: tuple[TensorSpec, ...] = ()
        self._outputs: tuple[TensorSpec, ...] = ()
        self._decoupled = False

    def load(self, spec: LoadSpec) -> None:
        self._inputs = declared_specs(spec.config.inputs, "inputs", spec, "a Python model")
        self._outputs = declared_specs(spec.config.outputs, "outputs", spec, "a Python model")
        sequencing = spec.config.sequence_batching
        if sequencing is not None:  # the tensors the server adds and keeps: the model takes and gives them
            batched = (spec.config.max_batch_size or 0) > 0 or bool(self._inputs and self._inputs[0].shape[:1] == (-1,))
            inputs, outputs = sequence_specs(sequencing, batched)
            self._inputs += tuple(s for s in inputs if s.name not in {i.name for i in self._inputs})
            self._outputs += tuple(s for s in outputs if s.name not in {o.name for o in self._outputs})
        module_name = f"tensorgate_user_model_{spec.model.replace('.', '_').replace('-', '_')}_{spec.version}"
        loader_spec = importlib.util.spec_from_file_location(module_name, spec.artifact)
        if loader_spec is None or loader_spec.loader is None:
            raise ModelLoadError(f"cannot import {spec.artifact.name}")
        module = importlib.util.module_from_spec(loader_spec)
        # A Triton model imports triton_python_backend_utils: the module of ours that stands for it.
        sys.modules.setdefault(triton_python.MODULE_NAME, triton_python)
        try:
            sys.modules[module_name] = module
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ModelLoadError(f"model.py raised on import: {type(exc).__name__}: {exc}") from exc
        classes = [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj)
            and issubclass(obj, PythonModel)
            and obj is not PythonModel
            and obj.__module__ == module_name
        ]
        triton_class = vars(module).get("TritonPythonModel")
        if not classes and inspect.isclass(triton_class):
            model: PythonModel = triton_python.TritonModel(
                triton_class(), spec.config, [output.name for output in self._outputs]
            )
        elif len(classes) != 1:
            raise ModelLoadError(
                "model.py must define exactly one tensorgate.PythonModel subclass (or a Triton "
                f"TritonPythonModel class), found {len(classes)}"
            )
        else:
            model = classes[0]()
        self._decoupled = spec.config.model_transaction_policy.decoupled
        if (
            self._decoupled
            and not isinstance(model, triton_python.TritonModel)
            and type(model).execute_decoupled is PythonModel.execute_decoupled
        ):
            raise ModelLoadError(
                f"{type(model).__name__} is configured decoupled (model_transaction_policy) but does not "
                "implement execute_decoupled(inputs, sender)"
            )
        context = ModelContext(
            name=spec.model,
            version=spec.version,
            directory=spec.directory,
            device=str(spec.device),
            parameters=dict(spec.config.parameters),
            instance=spec.instance,
        )
        try:
            model.load(context)
        except Exception as exc:
            raise ModelLoadError(f"{type(model).__name__}.load raised {type(exc).__name__}: {exc}") from exc
        self._model = model

    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        assert self._model is not None, "execute before load"
        results = self._model.execute(inputs)
        if not isinstance(results, Mapping):
            raise ModelError(f"execute returned {type(results).__name__}, not a dict of output arrays")
        return {spec.name: _declared(spec, results) for spec in self._outputs}

    def execute_decoupled(self, parts: Sequence[Mapping[str, Array]], sinks: Sequence[ResponseSink]) -> None:
        assert self._model is not None, "execute before load"
        if not self._decoupled:
            raise TypeError("the model is not configured decoupled (model_transaction_policy)")
        senders = [ResponseSender(sink, self._checked) for sink in sinks]
        try:
            if isinstance(self._model, triton_python.TritonModel):
                self._model.execute_requests(parts, senders)  # Triton's execute takes the batch's requests at once
            else:
                for inputs, sender in zip(parts, senders, strict=True):
                    self._model.execute_decoupled(inputs, sender)
        except BaseException:
            for sender in senders:  # answered with the error: the model's threads cannot add to it
                sender.close_after_failure()
            raise

    def _checked(self, outputs: Mapping[str, object]) -> dict[str, Array]:
        """One response of a decoupled model: each output it carries is declared and of its datatype
        (a response may carry some of the outputs, as Triton's may)."""
        if not isinstance(outputs, Mapping):
            raise ModelError(f"outputs must be a dict of arrays by output name, not {type(outputs).__name__}")
        declared = {spec.name: spec for spec in self._outputs}
        unknown = sorted(str(name) for name in outputs if name not in declared)
        if unknown:
            raise ModelError(f"the response carries output(s) {unknown} that the model does not declare")
        return {name: _declared(declared[name], outputs) for name in declared if name in outputs}

    def close(self) -> None:
        if self._model is not None:
            self._model.unload()
            self._model = None


def _declared(spec: TensorSpec, results: Mapping[str, object]) -> Array:
    """One output as config.yaml declares it: present, and of its datatype (numbers cast within their kind).

    Checked here, on the instance, so a model that returns the wrong thing fails with a message that
    names the output (a ModelError: the client reads it too, as Triton's would) instead of breaking
    the batch split or the encoder further down. Always a copy: a model may write its answers into
    a buffer it reuses on the next call, and the scheduler hands the instance its next batch while
    this one's answers are still being encoded (a test with a reused buffer and 16 clients saw half
    the answers overwritten). onnxruntime's outputs are new arrays on every run, so only this
    backend pays for the copy.
    """
    if spec.name not in results:
        raise ModelError(f"execute returned no output '{spec.name}' (it returned {sorted(map(str, results))})")
    array = np.asarray(results[spec.name])
    if spec.datatype is DataType.BYTES:
        if array.dtype.kind not in "OSU":
            raise ModelError(f"output '{spec.name}' is declared BYTES but execute returned {array.dtype}")
        return array.copy()
    wanted = spec.datatype.numpy
    if array.dtype == wanted:
        return array.copy()
    if not np.can_cast(array.dtype, wanted, casting="same_kind"):  # int to float passes; float to int does not
        raise ModelError(f"output '{spec.name}' is declared {spec.datatype.value} but execute returned {array.dtype}")
    return array.astype(wanted)
