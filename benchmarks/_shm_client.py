"""A closed-loop HTTP/1.1 load client for bench_shared_memory.py, run as its own process so that the
benchmark's CPU sampler counts it as the client.

The same client drives both arrangements, so they differ only in where the tensor travels:
``binary`` sends it in each body (Triton's binary extension) and asks for the output as binary;
``shm`` writes it once into a shared-memory region of the connection's own, registers that region
and one for the output, and sends a small JSON body naming them. Every connection keeps its
connection alive and sends its next request as soon as the last is answered.

``python _shm_client.py HOST PORT MODEL INPUT OUTPUT SHAPE OUT_BYTES MODE CONNECTIONS SECONDS``
prints a JSON object: requests answered, errors, elapsed seconds and latencies (ms).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

import numpy as np
import tritonclient.utils.shared_memory as shm


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self._reader, self._writer, self._host = reader, writer, host

    async def request(self, method: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length:
            await self._reader.readexactly(length)
        return status


def binary_body(model_input: str, output: str, tensor: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": model_input,
                    "shape": list(tensor.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": tensor.nbytes},
                }
            ],
            "outputs": [{"name": output, "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return header + tensor.tobytes(), headers


def shm_body(model_input: str, output: str, tensor: np.ndarray, tag: str, out_bytes: int) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": model_input,
                    "shape": list(tensor.shape),
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": f"in-{tag}", "shared_memory_byte_size": tensor.nbytes},
                }
            ],
            "outputs": [
                {
                    "name": output,
                    "parameters": {"shared_memory_region": f"out-{tag}", "shared_memory_byte_size": out_bytes},
                }
            ],
        }
    ).encode()


async def client(
    host: str,
    port: int,
    model: str,
    names: tuple[str, str],
    tensor: np.ndarray,
    out_bytes: int,
    mode: str,
    until: float,
) -> tuple[list[float], int, list[object]]:
    reader, writer = await asyncio.open_connection(host, port)
    connection = Connection(reader, writer, f"{host}:{port}")
    regions: list[object] = []
    path = f"/v2/models/{model}/infer"
    if mode == "shm":
        tag = uuid.uuid4().hex[:10]
        handle_in = shm.create_shared_memory_region(f"in-{tag}", f"/tg-bench-in-{tag}", tensor.nbytes)
        handle_out = shm.create_shared_memory_region(f"out-{tag}", f"/tg-bench-out-{tag}", out_bytes)
        regions += [handle_in, handle_out]
        shm.set_shared_memory_region(handle_in, [tensor])
        for name, key, size in (
            (f"in-{tag}", f"/tg-bench-in-{tag}", tensor.nbytes),
            (f"out-{tag}", f"/tg-bench-out-{tag}", out_bytes),
        ):
            register = json.dumps({"key": key, "offset": 0, "byte_size": size}).encode()
            assert await connection.request("POST", f"/v2/systemsharedmemory/region/{name}/register", register) == 200
        body, headers = shm_body(names[0], names[1], tensor, tag, out_bytes), {"Content-Type": "application/json"}
    else:
        body, headers = binary_body(names[0], names[1], tensor)
    latencies: list[float] = []
    errors = 0
    while time.perf_counter() < until:
        started = time.perf_counter()
        status = await connection.request("POST", path, body, headers)
        if status == 200:
            latencies.append((time.perf_counter() - started) * 1000)
        else:
            errors += 1
    if mode == "shm":
        await connection.request("POST", f"/v2/systemsharedmemory/region/in-{tag}/unregister", b"")
        await connection.request("POST", f"/v2/systemsharedmemory/region/out-{tag}/unregister", b"")
    writer.close()
    return latencies, errors, regions


async def main() -> None:
    host, port, model, model_input, output, shape, out_bytes, mode, connections, seconds = sys.argv[1:11]
    tensor = np.random.default_rng(0).standard_normal([int(d) for d in shape.split(",")]).astype(np.float32)
    started = time.perf_counter()
    until = started + float(seconds)
    results = await asyncio.gather(
        *[
            client(host, int(port), model, (model_input, output), tensor, int(out_bytes), mode, until)
            for _ in range(int(connections))
        ]
    )
    elapsed = time.perf_counter() - started
    latencies = sorted(x for lat, _, _ in results for x in lat)
    for _, _, regions in results:
        for handle in regions:
            shm.destroy_shared_memory_region(handle)
    print(
        json.dumps(
            {
                "answered": len(latencies),
                "errors": sum(e for _, e, _ in results),
                "elapsed_s": elapsed,
                "p50_ms": float(np.percentile(latencies, 50)) if latencies else float("nan"),
                "p99_ms": float(np.percentile(latencies, 99)) if latencies else float("nan"),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
