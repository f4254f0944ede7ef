"""planner-api's gRPC transport security: TLS credentials, the bearer-token check and a
client channel that carries both.

* Server: ``server_credentials(cert, key)`` reads the PEM files (both or neither; when
  set the server listens with TLS only); ``BearerToken`` is a ``grpc.aio`` server
  interceptor that lets an RPC through only with ``authorization: Bearer <token>``
  metadata (compared in constant time), except ``grpc.health.v1.Health``, which a
  liveness probe calls without credentials. Anything else is UNAUTHENTICATED.
* Client: ``client_channel(addr, ca=…, token=…)`` for ``koi`` tools and tests.

The token is never logged, put in an error message or shown by a repr.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2

log = structlog.get_logger(__name__)

HEALTH_PREFIX = "/" + health_pb2.DESCRIPTOR.services_by_name["Health"].full_name + "/"
_DENIED = "this server needs 'authorization: Bearer <token>' metadata with its token"


def _read(path: str | Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{what} {str(path)!r} cannot be read ({type(e).__name__})") from None
    if not data.strip():
        raise ValueError(f"{what} {str(path)!r} is empty")
    return data


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials | None:
    """TLS credentials from a PEM certificate (chain) and its key; None when neither is
    set. One without the other is an error, never a silent fall-back to plaintext."""
    if not cert_file and not key_file:
        return None
    if not cert_file or not key_file:
        raise ValueError("KOI_GRPC_TLS_CERT and KOI_GRPC_TLS_KEY go together: set both "
                         "(TLS only) or neither (plaintext)")
    return grpc.ssl_server_credentials([(_read(key_file, "KOI_GRPC_TLS_KEY"),
                                         _read(cert_file, "KOI_GRPC_TLS_CERT"))])


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape as ``handler`` that answers UNAUTHENTICATED
    (the shape must match, or the server cannot read the request)."""
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)

    kw = {"request_deserializer": handler.request_deserializer,
          "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kw)
    return grpc.unary_unary_rpc_method_handler(deny, **kw)


class BearerToken(grpc.aio.ServerInterceptor):
    """Refuses every RPC but health checks without ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the gRPC token is empty")
        self._expected = f"Bearer {token}".encode()

    def __repr__(self) -> str:
        return "BearerToken(<redacted>)"

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return handler
        given = b""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                break
        if hmac.compare_digest(given, self._expected):
            return handler
        log.warning("rpc_unauthenticated", method=details.method,
                    had_authorization=bool(given))
        return _denying(handler)


# --- clients ------------------------------------------------------------------------------

class _TokenMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                     grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the bearer token to every call of a channel."""

    def __init__(self, token: str) -> None:
        self._pair = ("authorization", f"Bearer {token}")

    def __repr__(self) -> str:
        return "_TokenMetadata(<redacted>)"

    def _with_token(self, details: Any) -> Any:
        return _Details(details.method, details.timeout,
                        [*(details.metadata or ()), self._pair], details.credentials,
                        details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, method: str, timeout: float | None, metadata: Any, credentials: Any,
                 wait_for_ready: bool | None, compression: Any) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = (credentials,
                                                                    wait_for_ready, compression)


def client_channel(addr: str, *, ca: str | Path | None = None, token: str | None = None,
                   server_name: str | None = None) -> grpc.Channel:
    """A channel to planner-api: TLS trusting the PEM CA file ``ca`` when given (else
    plaintext), and ``authorization: Bearer <token>`` on every call when ``token`` is
    given. ``server_name`` overrides the name checked against the certificate."""
    if ca:
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(
            addr, grpc.ssl_channel_credentials(root_certificates=_read(ca, "CA file")),
            options=options)
    else:
        channel = grpc.insecure_channel(addr)
    return grpc.intercept_channel(channel, _TokenMetadata(token)) if token else channel
