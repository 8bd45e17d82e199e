"""The management routes: Triton's model repository extension (index, load, unload), its shared-memory
extensions (status, register, unregister), the status document and page, and the OpenAPI document.

The repository routes need an admin key (the app's gate asks for it before the route runs) and a
model control mode that opens them (403 otherwise). They load only what the repository holds.
"""

from __future__ import annotations

from typing import Any

from tensorgate.errors import InvalidInput
from tensorgate.models.service import InferenceService
from tensorgate.models.status import StatusReport
from tensorgate.names import check_model_name
from tensorgate.observability.status_page import status_page
from tensorgate.protocols.http.body import Receive
from tensorgate.protocols.http.exchange import JSON, Call, Responder, Send
from tensorgate.protocols.http.inference_routes import HttpSettings, read_request_body
from tensorgate.protocols.http.openapi import openapi_json
from tensorgate.protocols.http.routes import Params, RouteTable
from tensorgate.protocols.http.v2_codec import dumps, loads_object
from tensorgate.protocols.shared_memory import CudaRegions, SharedMemoryRegions, is_local_peer, region_owner

_NO_STORE = (b"cache-control", b"no-store")


class ManagementRoutes:
    def __init__(
        self,
        service: InferenceService,
        responder: Responder,
        settings: HttpSettings,
        regions: SharedMemoryRegions,
        status: StatusReport,
    ) -> None:
        self._service = service
        self._out = responder
        self._settings = settings
        self._regions = regions
        self._status = status  # GET /v2/status
        self._openapi = openapi_json()  # GET /openapi.json, read once here at startup
        page = status_page()  # GET / and /status: the live status page, read once here too
        self._status_page, self._status_page_headers = page.body, page.headers

    def register(self, routes: RouteTable) -> None:
        routes.add("POST", "/v2/repository/index", self.repository_index)
        routes.add("POST", "/v2/repository/models/{model}/load", self.repository_load)
        routes.add("POST", "/v2/repository/models/{model}/unload", self.repository_unload)
        system = "/v2/systemsharedmemory"
        routes.add("GET", f"{system}/status", self.shared_memory_status)
        routes.add("GET", f"{system}/region/{{region}}/status", self.shared_memory_status)
        routes.add("POST", f"{system}/region/{{region}}/register", self.shared_memory_register)
        routes.add("POST", f"{system}/unregister", self.shared_memory_unregister)
        routes.add("POST", f"{system}/region/{{region}}/unregister", self.shared_memory_unregister)
        cuda = "/v2/cudasharedmemory"
        routes.add("GET", f"{cuda}/status", self.cuda_status)
        routes.add("GET", f"{cuda}/region/{{region}}/status", self.cuda_status)
        routes.add("POST", f"{cuda}/region/{{region}}/register", self.cuda_register)
        routes.add("POST", f"{cuda}/unregister", self.cuda_unregister)
        routes.add("POST", f"{cuda}/region/{{region}}/unregister", self.cuda_unregister)
        routes.add("GET", "/v2/status", self.status_document)  # what the status page polls (metrics role)
        routes.add("GET", "/", self.root)
        routes.add("GET", "/status", self.status_page)
        routes.add("GET", "/openapi.json", self.openapi)  # behind the same gate as the metadata routes

    async def _document(self, call: Call, receive: Receive) -> dict[str, Any]:
        """A management call's JSON body (none: ``{}``)."""
        body = await read_request_body(call, receive, self._settings.max_body_bytes)
        return loads_object(body, self._settings.limits) if body.strip() else {}

    # -- the model repository extension ----------------------------------------------------------

    async def repository_index(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        self._service.authorize_repository(changes=False)
        document = await self._document(call, receive)
        rows = await self._service.repository_index(ready_only=document.get("ready") is True)
        await self._out.json(call, send, 200, rows)

    async def repository_load(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name = self._changed_model(call, params)
        parameters = await self._parameters(call, receive)
        await self._service.load_model(name, _load_config(parameters))
        await self._out.body(call, send, 200, b"", [])

    async def repository_unload(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name = self._changed_model(call, params)
        await self._parameters(call, receive)  # unload_dependents is accepted: no model depends on another
        await self._service.unload_model(name)
        await self._out.body(call, send, 200, b"", [])

    def _changed_model(self, call: Call, params: Params) -> str:
        self._service.authorize_repository(changes=True)
        name = check_model_name(params["model"])
        call.model = name
        return name

    async def _parameters(self, call: Call, receive: Receive) -> dict[str, Any]:
        parameters = (await self._document(call, receive)).get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidInput("'parameters' must be an object")
        return parameters

    # -- the shared-memory extensions ------------------------------------------------------------

    def _regions_for(self, call: Call) -> SharedMemoryRegions:
        self._regions.check_caller(is_local_peer(call.peer_host))
        return self._regions

    async def shared_memory_status(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        regions = self._regions_for(call)
        await self._out.json(call, send, 200, regions.status(region_owner(call.identity), params.get("region")))

    async def shared_memory_register(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        regions = self._regions_for(call)
        document = await self._document(call, receive)
        regions.register(
            region_owner(call.identity),
            params["region"],
            document.get("key"),
            document.get("offset", 0),
            document.get("byte_size"),
        )
        await self._out.json(call, send, 200, {})

    async def shared_memory_unregister(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        regions = self._regions_for(call)
        regions.unregister(region_owner(call.identity), params.get("region"))
        await self._out.json(call, send, 200, {})

    async def cuda_status(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._out.json(call, send, 200, CudaRegions.status(params.get("region")))

    async def cuda_register(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._document(call, receive)  # a malformed body is 400 for what it is
        CudaRegions.register(params["region"])

    async def cuda_unregister(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        CudaRegions.unregister(params.get("region"))
        await self._out.json(call, send, 200, {})

    # -- status and documents --------------------------------------------------------------------

    async def status_document(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        visible = None if call.identity is None else call.identity.models
        await self._out.body(call, send, 200, dumps(self._status.document(visible)), [JSON, _NO_STORE])

    async def root(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        """A browser gets the status page; any other client KServe V1's liveness answer, which the
        KServe SDK's V1 client reads from the server's root."""
        if "text/html" in (call.header(b"accept") or ""):
            await self.status_page(call, params, receive, send)
        else:
            await self._out.body(call, send, 200, b'{"status":"alive"}', [JSON])

    async def status_page(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._out.body(call, send, 200, self._status_page, self._status_page_headers)

    async def openapi(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._out.body(call, send, 200, self._openapi, [JSON])


def _load_config(parameters: dict[str, Any]) -> str | None:
    """The ``config`` override of a load request. Model files in the request (Triton's ``file:``
    parameters) are refused: this server loads only what its repository holds."""
    if any(isinstance(key, str) and key.startswith("file:") for key in parameters):
        raise InvalidInput("this server loads models only from its repository; 'file:' parameters are refused")
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise InvalidInput("the 'config' parameter must be a string holding a JSON model configuration")
    return config
