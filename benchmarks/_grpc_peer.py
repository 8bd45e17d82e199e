"""``tensorgate serve`` whose gRPC port runs on another HTTP/2: the ``h2`` library's, or grpcio's server.

``bench_grpc_transport.py`` starts it through ``ServerProcess(command=...)``:
``python _grpc_peer.py {h2,grpcio} SERVE-FLAGS`` takes ``tensorgate serve``'s flags. The server is
the real one (models, schedulers, the HTTP and metrics ports) with its own gRPC port off; the gRPC
port here serves the same servicer (``InferenceServicer`` over the same ``InferenceService``) on:

- ``h2``: tensorgate's gRPC server with each connection on the h2 library (``_h2_connection.py``);
- ``grpcio``: grpcio's own server (``grpc.aio``), which reads sockets on threads of its own.

Neither runs the gate (authentication) or the health and reflection services: the benchmark
measures inference calls only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import grpc
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).parent))

from _h2_connection import H2GrpcServer

from tensorgate.cli import serve
from tensorgate.observability.logging import configure_logging
from tensorgate.protocols.grpc.call import CallSettings
from tensorgate.protocols.grpc.codec import GrpcLimits
from tensorgate.protocols.grpc.listener import MAX_SEND_BYTES
from tensorgate.protocols.grpc.methods import MethodTable
from tensorgate.protocols.grpc.servicer import GrpcSettings, InferenceServicer, add_to_server
from tensorgate.server import STOP_SIGNALS, Server

TRANSPORTS = ("h2", "grpcio")


async def run(transport: str, args: argparse.Namespace) -> None:
    config, base_dir, source = serve.build_config(args)
    section = config.server
    grpc_port, ports_file = section.grpc_port or 0, section.ports_file
    config = config.model_copy(update={"server": section.model_copy(update={"grpc_port": None, "ports_file": None})})
    configure_logging(section.log_level, section.log_format, section.access_log, None)
    server = Server(config, config_dir=base_dir, config_source=source)
    await server.start()
    max_message = section.grpc_max_message_bytes or section.max_body_bytes
    settings = GrpcSettings(limits=GrpcLimits(section.max_elements, max_message), access=server.access_log)
    servicer = InferenceServicer(server.service, settings, server.tracer, server.clock)
    peer: Any
    if transport == "grpcio":
        peer = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message),
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
            ]
        )
        add_to_server(servicer, peer)
        port = peer.add_insecure_port(f"{section.host}:{grpc_port}")
        await peer.start()
    else:
        methods = MethodTable()
        add_to_server(servicer, methods)
        peer = H2GrpcServer(methods, CallSettings(max_receive_bytes=max_message, max_send_bytes=MAX_SEND_BYTES))
        port = await peer.start(section.host, grpc_port)
    if ports_file is not None:
        tmp = ports_file.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps({**server.ports, "grpc": port}))
        tmp.replace(ports_file)
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await peer.stop(1.0)
    await server.shutdown()


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in TRANSPORTS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(TRANSPORTS)}}} SERVE-FLAGS")
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as `tensorgate serve` runs
        runner.run(run(sys.argv[1], parser.parse_args(sys.argv[2:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
