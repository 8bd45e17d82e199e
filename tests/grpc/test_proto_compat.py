"""Our protos against the descriptors tritonclient ships: same names, numbers, types and labels.

Our .proto files are compiled in a temporary directory (never imported here), so nothing clashes
with tritonclient's copies in protobuf's default pool.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

from tensorgate.protocols.grpc.generate import PROTO_FILES, PROTOS

grpc_tools = pytest.importorskip("grpc_tools.protoc")

FieldKey = tuple[str, str]  # (message full name, field name)


def _ours(tmp_path: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    out = tmp_path / "set.pb"
    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports", *PROTO_FILES]
    assert grpc_tools.main(args) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return {f.name: f for f in files.file}


def _theirs(module: object) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)  # type: ignore[attr-defined]
    return proto


def _fields(prefix: str, messages: list[descriptor_pb2.DescriptorProto]) -> dict[FieldKey, tuple[int, int, int, str]]:
    out: dict[FieldKey, tuple[int, int, int, str]] = {}
    for message in messages:
        name = f"{prefix}.{message.name}"
        for field in message.field:
            out[(name, field.name)] = (field.number, field.type, field.label, field.type_name)
        out.update(_fields(name, list(message.nested_type)))
    return out


def _enums(prefix: str, file: descriptor_pb2.FileDescriptorProto) -> dict[str, dict[str, int]]:
    found = {f"{prefix}.{e.name}": {v.name: v.number for v in e.value} for e in file.enum_type}
    for message in file.message_type:
        for e in message.enum_type:
            found[f"{prefix}.{message.name}.{e.name}"] = {v.name: v.number for v in e.value}
    return found


@pytest.mark.parametrize(
    ("ours_name", "module"), [("grpc_service.proto", service_pb2), ("model_config.proto", model_config_pb2)]
)
def test_every_field_matches_triton(tmp_path: Path, ours_name: str, module: object) -> None:
    ours = _ours(tmp_path)[ours_name]
    theirs = _theirs(module)
    assert ours.package == theirs.package == "inference"
    mine = _fields("", list(ours.message_type))
    reference = _fields("", list(theirs.message_type))
    missing = sorted(k for k in mine if k not in reference)
    assert not missing, f"fields Triton does not have: {missing}"
    different = {k: (v, reference[k]) for k, v in mine.items() if v != reference[k]}
    assert not different
    for enum, values in _enums("", ours).items():
        assert values.items() <= _enums("", theirs)[enum].items()


def test_every_rpc_matches_triton(tmp_path: Path) -> None:
    ours = _ours(tmp_path)["grpc_service.proto"].service[0]
    theirs = {m.name: m for m in _theirs(service_pb2).service[0].method}
    assert ours.name == "GRPCInferenceService"
    for method in ours.method:
        reference = theirs[method.name]
        assert (method.input_type, method.output_type) == (reference.input_type, reference.output_type)
        assert (method.client_streaming, method.server_streaming) == (
            reference.client_streaming,
            reference.server_streaming,
        )
