"""The management RPCs of ``inference.GRPCInferenceService``: Triton's model repository extension
(index, load, unload) and its shared-memory extensions (status, register, unregister).

A part of :class:`~tensorgate.protocols.grpc.servicer.InferenceServicer` (one generated servicer
holds every RPC of the service), kept apart from inference. The transport's gate took an admin key
for the repository RPCs before the call reached here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tensorgate.models.service import InferenceService
from tensorgate.names import check_model_name
from tensorgate.protocols.grpc import codec
from tensorgate.protocols.grpc.context import is_local, owner_of
from tensorgate.protocols.grpc.errors import Metadata
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.shared_memory import CudaRegions, SharedMemoryRegions

T = TypeVar("T")


class ManagementRpcs:
    _service: InferenceService
    _regions: SharedMemoryRegions

    if TYPE_CHECKING:  # the servicer's error boundary, which every RPC runs through

        async def _guard(self, context: Any, call: Callable[[], Awaitable[T]], ids: Metadata = ()) -> T: ...

    # -- repository (management) -----------------------------------------------------------------

    def _authorize(self, context: Any, *, changes: bool = True) -> None:
        """As HTTP: the transport's gate took an admin credential; PERMISSION_DENIED where the model
        control mode does not allow the call."""
        self._service.authorize_repository(changes=changes)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._authorize(context, changes=False)
            return codec.encode_index(await self._service.repository_index(), request.ready)

        return await self._guard(context, call)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._authorize(context)
            name = check_model_name(request.model_name)
            await self._service.load_model(name, codec.load_config(request.parameters))
            return pb.RepositoryModelLoadResponse()

        return await self._guard(context, call)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._authorize(context)
            await self._service.unload_model(check_model_name(request.model_name))
            return pb.RepositoryModelUnloadResponse()

        return await self._guard(context, call)

    # -- shared memory (Triton's extension) ------------------------------------------------------

    def _regions_for(self, context: Any) -> SharedMemoryRegions:
        self._regions.check_caller(is_local(context))
        return self._regions

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            answer = pb.SystemSharedMemoryStatusResponse()
            for region in self._regions_for(context).status(owner_of(context), request.name or None):
                status = answer.regions[region["name"]]
                status.name, status.key = region["name"], region["key"]
                status.offset, status.byte_size = region["offset"], region["byte_size"]
            return answer

        return await self._guard(context, call)

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._regions_for(context).register(
                owner_of(context), request.name, request.key, request.offset, request.byte_size
            )
            return pb.SystemSharedMemoryRegisterResponse()

        return await self._guard(context, call)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._regions_for(context).unregister(owner_of(context), request.name or None)
            return pb.SystemSharedMemoryUnregisterResponse()

        return await self._guard(context, call)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            CudaRegions.status(request.name or None)
            return pb.CudaSharedMemoryStatusResponse()

        return await self._guard(context, call)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            CudaRegions.register(request.name)
            return pb.CudaSharedMemoryRegisterResponse()

        return await self._guard(context, call)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            CudaRegions.unregister(request.name or None)
            return pb.CudaSharedMemoryUnregisterResponse()

        return await self._guard(context, call)
