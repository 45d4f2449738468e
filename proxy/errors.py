"""One error tree for everything Keel says to a client, rendered once as OpenAI-style JSON.

    ProxyError (500 server_error)
    ├── BadRequestError (400 invalid_request_error)
    ├── AuthenticationError (401 authentication_error)
    ├── ForbiddenError (403 permission_error)
    ├── RequestTimeoutError (408 invalid_request_error)
    ├── BodyTooLargeError (413 invalid_request_error)
    ├── StoreUnavailableError (503 service_unavailable)
    ├── UpstreamConnectError (502 upstream_error)
    └── UpstreamTimeoutError (504 upstream_error)
"""

from __future__ import annotations

import orjson


class ProxyError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


class BadRequestError(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationError(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ForbiddenError(ProxyError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class StoreUnavailableError(ProxyError):
    status = 503
    type = "service_unavailable"
    code = "store_unavailable"


class RequestTimeoutError(ProxyError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class BodyTooLargeError(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UpstreamConnectError(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeoutError(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


def error_body(message: str, type_: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code, "param": param}})
