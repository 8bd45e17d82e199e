"""Triton's example model repository (``docs/examples/model_repository`` of triton-inference-server/server),
rebuilt for the tests: the same model names, ``config.pbtxt`` files and behaviour.

- ``simple``, ``simple_int8``: ONNX graphs, ``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 = INPUT0 - INPUT1``,
  INT32 (INT8) ``[16]`` per row, ``max_batch_size: 8``; their configs as Triton's.
- ``simple_string``: the same arithmetic on BYTES holding decimal numbers (Triton's is an ONNX graph
  over strings; here a Triton Python-backend model, so its config says ``backend: "python"``).
- ``simple_identity``: a Triton Python-backend model that returns its BYTES input, as Triton's does.
- ``simple_sequence``: Triton's sequence example: an ONNX graph ``OUTPUT = INPUT * READY + START``
  over INT32 ``[1]``, the control inputs START and READY filled by the server (``direct`` strategy,
  Triton's config).
- ``sequence_accumulate``: a Triton Python-backend model with every control (START, END, READY,
  CORRID) and implicit state: ``OUTPUT`` is the running sum of the sequence's inputs (its state),
  plus the correlation id on the request that ends it; ``oldest`` strategy.

The Python models are written against ``triton_python_backend_utils`` as Triton's own are.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

SIMPLE_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{
    name: "INPUT0"
    data_type: {datatype}
    dims: [ 16 ]
  }},
  {{
    name: "INPUT1"
    data_type: {datatype}
    dims: [ 16 ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: {datatype}
    dims: [ 16 ]
  }},
  {{
    name: "OUTPUT1"
    data_type: {datatype}
    dims: [ 16 ]
  }}
]
"""

STRING_CONFIG = """
name: "simple_string"
backend: "python"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_STRING
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_STRING
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_STRING
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_STRING
    dims: [ 16 ]
  }
]
"""

IDENTITY_CONFIG = """
name: "simple_identity"
backend: "python"
max_batch_size: 8

input [
  {
    name: "INPUT0"
    data_type: TYPE_STRING
    dims: [ -1 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_STRING
    dims: [ -1 ]
  }
]
"""

STRING_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sum and difference of two tensors of decimal numbers written as strings."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        output0 = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        self.output_dtype = pb_utils.triton_string_to_numpy(output0["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            try:
                x, y = a.astype(np.int64), b.astype(np.int64)
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"not numbers: {exc}")))
                continue
            text = np.vectorize(lambda v: str(v).encode(), otypes=[object])
            out0 = pb_utils.Tensor("OUTPUT0", text(x + y).astype(self.output_dtype))
            out1 = pb_utils.Tensor("OUTPUT1", text(x - y).astype(self.output_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
'''

IDENTITY_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 is INPUT0, byte for byte."""

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())]
            )
            for request in requests
        ]

    def finalize(self):
        pass
'''


def _add_sub(elem: int) -> bytes:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, ``[-1, 16]`` of ``elem``, computed in INT32."""
    nodes = []
    inputs = ["INPUT0", "INPUT1"]
    if elem != TensorProto.INT32:  # onnxruntime adds INT32; narrower types are cast around it
        nodes += [helper.make_node("Cast", [name], [f"{name}_32"], to=TensorProto.INT32) for name in inputs]
        inputs = [f"{name}_32" for name in inputs]
    for op, out in (("Add", "OUTPUT0"), ("Sub", "OUTPUT1")):
        if elem == TensorProto.INT32:
            nodes.append(helper.make_node(op, inputs, [out]))
        else:
            nodes.append(helper.make_node(op, inputs, [f"{out}_32"]))
            nodes.append(helper.make_node("Cast", [f"{out}_32"], [out], to=elem))
    graph = helper.make_graph(
        nodes,
        "simple",
        [helper.make_tensor_value_info(name, elem, ["batch", 16]) for name in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(name, elem, ["batch", 16]) for name in ("OUTPUT0", "OUTPUT1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


SEQUENCE_CONFIG = """
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ]
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

ACCUMULATE_CONFIG = """
name: "sequence_accumulate"
backend: "python"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 64 max_queue_delay_microseconds: 2000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "SUM_IN"
      output_name: "SUM_OUT"
      data_type: TYPE_INT64
      dims: [ 1 ]
      initial_state: { data_type: TYPE_INT64 dims: [ 1 ] zero_data: true name: "zeros" }
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "CONTROLS" data_type: TYPE_INT64 dims: [ 4 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

# OUTPUT: the running sum (the state), plus CORRID on the END request; CONTROLS echoes START, END,
# READY and CORRID as the model saw them, so tests can check the server filled them.
ACCUMULATE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().astype(np.int64)
            start, end, ready, corrid = (
                pb_utils.get_input_tensor_by_name(request, name).as_numpy().astype(np.int64)
                for name in ("START", "END", "READY", "CORRID")
            )
            total = pb_utils.get_input_tensor_by_name(request, "SUM_IN").as_numpy() + value
            output = total + corrid * end
            controls = np.concatenate([start, end, ready, corrid], axis=1)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT", output),
                        pb_utils.Tensor("SUM_OUT", total),
                        pb_utils.Tensor("CONTROLS", controls),
                    ]
                )
            )
        return responses
"""


def _sequence_graph() -> bytes:
    """OUTPUT = INPUT * READY + START, INT32 ``[-1, 1]``."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT", "READY"], ["ready_input"]),
            helper.make_node("Add", ["ready_input", "START"], ["OUTPUT"]),
        ],
        "simple_sequence",
        [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1]) for name in ("INPUT", "START", "READY")],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["batch", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _model(repo: Path, name: str, config: str, files: dict[str, bytes | str]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config.lstrip())
    for file, content in files.items():
        path = repo / name / "1" / file
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)


def build_triton_repository(repo: Path) -> Path:
    """Write the example repository under ``repo``; returns it."""
    _model(
        repo,
        "simple",
        SIMPLE_CONFIG.format(name="simple", datatype="TYPE_INT32"),
        {"model.onnx": _add_sub(TensorProto.INT32)},
    )
    simple_int8 = SIMPLE_CONFIG.format(name="simple_int8", datatype="TYPE_INT8")
    _model(repo, "simple_int8", simple_int8, {"model.onnx": _add_sub(TensorProto.INT8)})
    _model(repo, "simple_string", STRING_CONFIG, {"model.py": STRING_MODEL})
    _model(repo, "simple_identity", IDENTITY_CONFIG, {"model.py": IDENTITY_MODEL})
    _model(repo, "simple_sequence", SEQUENCE_CONFIG, {"model.onnx": _sequence_graph()})
    _model(repo, "sequence_accumulate", ACCUMULATE_CONFIG, {"model.py": ACCUMULATE_MODEL})
    return repo
