"""The worker process: one backend on one device, executing batches the server sends it.

Started by :class:`~tensorgate.instances.process_instance.ProcessInstance` as
``python -m tensorgate.instances.worker_main``. It inherits a control socket and two memfd
regions (inputs written by the server, outputs written here). It dies with its parent
(PR_SET_PDEATHSIG) and ignores SIGINT, so a Ctrl-C in a terminal lets the server drain first.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import orjson

from tensorgate.backends.base import Device, LoadSpec
from tensorgate.backends.python_model import ModelError
from tensorgate.backends.registry import create_backend
from tensorgate.config.model_config import ModelConfig
from tensorgate.errors import ModelLoadError
from tensorgate.instances.wire import (
    HEADER,
    Kind,
    Region,
    decode_header,
    decode_meta,
    encode_frame,
    read_tensors,
    write_tensors,
)
from tensorgate.memory import tune_malloc

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the closed control socket still ends the loop
        pass


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def load_spec_from_json(text: str) -> LoadSpec:
    raw: dict[str, Any] = orjson.loads(text)
    return LoadSpec(
        model=raw["model"],
        version=int(raw["version"]),
        artifact=Path(raw["artifact"]),
        directory=Path(raw["directory"]),
        config=ModelConfig.model_validate(raw["config"]),
        device=Device(raw["device"]["kind"], int(raw["device"]["index"])),
        instance=str(raw.get("instance", "")),
    )


def load_spec_to_json(spec: LoadSpec) -> str:
    return orjson.dumps(
        {
            "model": spec.model,
            "version": spec.version,
            "artifact": str(spec.artifact),
            "directory": str(spec.directory),
            "config": spec.config.model_dump(mode="json"),
            "device": {"kind": spec.device.kind, "index": spec.device.index},
            "instance": spec.instance,
        }
    ).decode()


def serve(spec: LoadSpec, backend_name: str, control: socket.socket, inputs: Region, outputs: Region) -> int:
    try:
        backend = create_backend(backend_name)
        backend.load(spec)
    except ModelLoadError as exc:
        control.sendall(encode_frame(Kind.LOAD_FAILED, 0, 0, {"error": str(exc)}))
        return 1
    except Exception as exc:
        control.sendall(encode_frame(Kind.LOAD_FAILED, 0, 0, {"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    specs = {
        "inputs": [s.to_metadata() for s in backend.inputs()],
        "outputs": [s.to_metadata() for s in backend.outputs()],
    }
    control.sendall(encode_frame(Kind.READY, 0, 0, specs))
    while True:
        header = _recv_exact(control, HEADER.size)
        if header is None:
            break  # the server closed the channel: shut down
        kind, seq, region_size, meta_len = decode_header(header)
        meta_raw = _recv_exact(control, meta_len)
        if meta_raw is None:
            break
        if kind is not Kind.EXECUTE:
            continue
        meta = decode_meta(meta_raw)
        try:
            inputs.ensure(region_size, grow_file=False)
            batch = read_tensors(inputs, meta.get("tensors"), copy=False)
            result = backend.execute(batch)
            del batch  # views into the input region must not outlive the batch
            described = write_tensors(outputs, result)
            reply = encode_frame(Kind.RESULT, seq, outputs.size, {"tensors": described})
        except Exception as exc:
            failure = {"error": f"{type(exc).__name__}: {exc}"}
            if isinstance(exc, ModelError):  # a message the model meant for the client
                failure["public"] = str(exc)
            reply = encode_frame(Kind.ERROR, seq, 0, failure)
        control.sendall(reply)
    backend.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorgate-worker")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--input-fd", type=int, required=True)
    parser.add_argument("--output-fd", type=int, required=True)
    parser.add_argument("--cpus", help="comma-separated CPUs this worker runs on")
    args = parser.parse_args(argv)
    if args.cpus:  # before any thread starts, so every thread the backend starts inherits them
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    _die_with_parent()
    tune_malloc()  # as the server does: batches read from shared memory are copied into fresh arrays
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = load_spec_from_json(sys.stdin.readline())
    control = socket.socket(fileno=args.control_fd)
    return serve(spec, args.backend, control, Region(args.input_fd), Region(args.output_fd))


if __name__ == "__main__":
    sys.exit(main())
