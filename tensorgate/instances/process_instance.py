"""An instance in a worker process of its own (``isolation: process``).

For Python models that hold the GIL (two processes give twice the throughput of one) and for any
model whose crash must not touch the server. One process per instance, as operators run one
process per device. Tensors cross through shared memory (see ``wire``), never pickled.

If the worker dies, the batch it was running fails with :class:`InstanceDied` (the scheduler
retries it once elsewhere), the instance turns unhealthy, and it is restarted with backoff. After
``CRASH_LOOP_LIMIT`` consecutive failed starts the crash loop is logged and the pool keeps reporting
it unhealthy (a model with no healthy instance is not ready) while tries go on, at most 30 s apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence

from tensorgate.backends.base import LoadSpec
from tensorgate.errors import ModelLoadError
from tensorgate.instances.base import Instance, InstanceDied, ModelFailed
from tensorgate.instances.wire import (
    HEADER,
    Frame,
    Kind,
    Region,
    decode_header,
    decode_meta,
    encode_frame,
    read_tensors,
    write_batch,
)
from tensorgate.instances.worker_env import worker_environment
from tensorgate.instances.worker_main import load_spec_to_json
from tensorgate.types import Array, DataType, TensorSpec

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 300.0
BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
CRASH_LOOP_LIMIT = 5


def _specs(raw: object) -> tuple[TensorSpec, ...]:
    assert isinstance(raw, list)
    return tuple(TensorSpec(str(s["name"]), DataType.parse(s["datatype"]), tuple(s["shape"])) for s in raw)


class ProcessInstance(Instance):
    def __init__(self, name: str, backend: str, spec: LoadSpec, cpus: frozenset[int] | None = None) -> None:
        super().__init__(name, spec.device)
        self._backend = backend
        self._spec = spec
        self._cpus = cpus
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._inputs: Region | None = None
        self._outputs: Region | None = None
        self._pending: asyncio.Future[Frame] | None = None
        self._seq = 0
        self._inputs_spec: tuple[TensorSpec, ...] = ()
        self._outputs_spec: tuple[TensorSpec, ...] = ()
        self._healthy = False  # in rotation: the pool may hand it batches
        self._running = False  # the worker is up and answering (also while warming, before rotation)
        self._closing = False
        self._watch: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._hung_after_s = spec.config.health_check.batch_timeout_s

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await self._spawn()
        self._set_health(True)

    async def _spawn(self) -> None:
        inputs = Region.create(f"tg-{self.name}-in", 1 << 16)
        outputs = Region.create(f"tg-{self.name}-out", 1 << 16)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = (child.fileno(), inputs.fd, outputs.fd)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tensorgate.instances.worker_main",
                "--backend",
                self._backend,
                "--control-fd",
                str(fds[0]),
                "--input-fd",
                str(fds[1]),
                "--output-fd",
                str(fds[2]),
                *(["--cpus", ",".join(map(str, sorted(self._cpus)))] if self._cpus else []),
                stdin=asyncio.subprocess.PIPE,
                pass_fds=fds,
                env=worker_environment(os.environ),
            )
        except OSError as exc:
            parent.close()
            child.close()
            inputs.close()
            outputs.close()
            raise ModelLoadError(f"cannot start a worker process: {exc.strerror}") from exc
        child.close()
        assert process.stdin is not None
        process.stdin.write(load_spec_to_json(self._spec).encode() + b"\n")
        await process.stdin.drain()
        process.stdin.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        self._process, self._reader, self._writer = process, reader, writer
        self._inputs, self._outputs = inputs, outputs
        try:
            frame = await asyncio.wait_for(self._read_frame(), LOAD_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            await self._terminate()
            raise ModelLoadError(f"worker for {self.name} did not start: {type(exc).__name__}") from exc
        if frame.kind is Kind.LOAD_FAILED:
            await self._terminate()
            raise ModelLoadError(str(frame.meta.get("error", "the worker failed to load the model")))
        if frame.kind is not Kind.READY:
            await self._terminate()
            raise ModelLoadError("the worker answered its start with an unexpected frame")
        self._inputs_spec = _specs(frame.meta["inputs"])
        self._outputs_spec = _specs(frame.meta["outputs"])
        self._watch = asyncio.get_running_loop().create_task(self._watch_worker(process, reader))
        self._running = True
        log.info("worker %s started (pid %d)", self.name, process.pid)

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs (None while it is down or restarting)."""
        return self._process.pid if self._process is not None and self._running else None

    @property
    def healthy(self) -> bool:
        return self._healthy

    def _set_health(self, healthy: bool) -> None:
        if healthy != self._healthy:
            self._healthy = healthy
            if self.on_health_change is not None:
                self.on_health_change(self, self.available)

    @property
    def can_restart(self) -> bool:
        return True

    async def restart(self) -> None:
        """Kill the worker (its batch fails as InstanceDied) and wait for it to start again and warm up;
        a restart already under way (the worker died by itself) is waited for instead."""
        if self._closing:
            raise InstanceDied(f"worker {self.name} is closing")
        if self._restart_task is None or self._restart_task.done():
            process = self._process
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
            if self._watch is not None and not self._watch.done():
                # It sees the exit: fails the batch in flight, and starts the restart with backoff.
                await asyncio.wait({self._watch}, timeout=5.0)
            if self._restart_task is None or self._restart_task.done():
                self._restart_task = asyncio.get_running_loop().create_task(self._restart())
        await asyncio.shield(self._restart_task)

    async def aclose(self) -> None:
        self._closing = True
        if self._restart_task is not None:
            self._restart_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._restart_task
        await self._terminate()

    async def _terminate(self) -> None:
        self._set_health(False)
        self._running = False
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        if self._writer is not None:
            self._writer.close()  # the worker sees EOF and exits on its own
        process = self._process
        if process is not None and process.returncode is None:
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        for region in (self._inputs, self._outputs):
            if region is not None:
                region.close()
        self._inputs = self._outputs = None
        self._reader = self._writer = None

    # -- execution -------------------------------------------------------------------------------

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return self._inputs_spec

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return self._outputs_spec

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return await self._execute_parts([inputs])

    async def _execute_parts(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        """The requests' inputs go straight to their rows in shared memory, merged there (one copy)."""
        if not self._running or self._writer is None or self._inputs is None or self._outputs is None:
            raise InstanceDied(f"worker {self.name} is not running")
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        described = write_batch(self._inputs, parts, self.pads)
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending = future
        self._writer.write(encode_frame(Kind.EXECUTE, self._seq, self._inputs.size, {"tensors": described}))
        try:
            frame = await asyncio.wait_for(asyncio.shield(future), self._hung_after_s)
        except TimeoutError:
            log.error("worker %s hung for %.0f s on one batch: killing it", self.name, self._hung_after_s)
            self._running = False
            self._set_health(False)  # out of rotation now, so the retry of this batch goes elsewhere
            self._kill()
            raise InstanceDied(f"worker {self.name} hung") from None
        finally:
            self._pending = None
        if frame.kind is Kind.ERROR:
            public = frame.meta.get("public")
            raise ModelFailed(str(frame.meta.get("error", "model error")), public if isinstance(public, str) else None)
        if frame.kind is not Kind.RESULT or frame.seq != self._seq:
            raise InstanceDied(f"worker {self.name} answered out of turn")
        self._outputs.ensure(frame.region_size, grow_file=False)
        return read_tensors(self._outputs, frame.meta.get("tensors"), copy=True)

    def _kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()

    async def _read_frame(self) -> Frame:
        assert self._reader is not None
        header = await self._reader.readexactly(HEADER.size)
        kind, seq, region_size, meta_len = decode_header(header)
        meta = decode_meta(await self._reader.readexactly(meta_len))
        return Frame(kind, seq, region_size, meta)

    async def _watch_worker(self, process: asyncio.subprocess.Process, reader: asyncio.StreamReader) -> None:
        """Read answers until the worker goes away; then fail its batch and restart it."""
        try:
            while True:
                frame = await self._read_frame()
                if self._pending is not None and not self._pending.done():
                    self._pending.set_result(frame)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            pass
        except asyncio.CancelledError:
            return
        except Exception:  # a malformed frame: treat the worker as broken
            log.exception("worker %s sent a bad frame", self.name)
            self._kill()
        self._running = False
        code = await process.wait()
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(InstanceDied(f"worker {self.name} exited with code {code}"))
        if self._closing:
            return
        self._set_health(False)
        if self._restart_task is not None and not self._restart_task.done():
            # It died while a restart was warming it up: that restart sees the failure and goes on.
            log.warning("worker %s (pid %d) exited with code %s while restarting", self.name, process.pid, code)
            return
        log.warning("worker %s (pid %d) exited with code %s: restarting", self.name, process.pid, code)
        self._restart_task = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        """Start the worker again, backing off (capped at 30 s) for as long as starts keep failing.

        The instance stays out of rotation meanwhile, and rejoins only once it has run the version's
        warm-up. Every failed try is reported (``on_lost``: the scheduler then answers what
        is queued rather than leave it waiting on a crash loop); after ``CRASH_LOOP_LIMIT`` failures in
        a row the crash loop is logged once, and the tries go on (backing off to the cap), so a fixed
        cause (a disk that filled, a device that came back) brings the instance back without a server
        restart. Nothing a start raises ends the loop: an instance that silently stopped trying would
        stay down for good.
        """
        await self._terminate_quietly()
        attempt = 0
        while not self._closing:
            await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            if self._closing:
                return
            attempt += 1
            try:
                await self._spawn()
                if self.warm is not None:
                    await self.warm(self)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, ModelLoadError | InstanceDied):  # it would not load, or died warming up
                    log.error("worker %s restart %d failed: %s", self.name, attempt, exc)
                else:
                    log.exception("worker %s restart %d failed", self.name, attempt)
                try:
                    await self._terminate()
                except Exception:  # cleaning up a failed start must not end the tries either
                    log.exception("worker %s: cleaning up after restart %d failed", self.name, attempt)
                if attempt == CRASH_LOOP_LIMIT:
                    log.error(
                        "worker %s failed %d restarts in a row: a crash loop; it stays out of rotation "
                        "and is retried at most %.0f s apart",
                        self.name,
                        CRASH_LOOP_LIMIT,
                        BACKOFF_S[-1],
                    )
                if self.on_lost is not None:
                    self.on_lost(self)
                continue
            if self._closing:
                return
            self._set_health(True)
            if self.on_restart is not None:
                self.on_restart(self)
            return

    async def _terminate_quietly(self) -> None:
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()
            for region in (self._inputs, self._outputs):
                if region is not None:
                    region.close()
            self._inputs = self._outputs = None
            self._reader = self._writer = None
