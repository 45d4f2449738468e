"""One error tree for everything Keel says to a client, rendered once in the client's API shape
(`Shape.error_body`, `Shape.error_event`): OpenAI-style JSON for Chat Completions, Responses
and Keel's own routes, Anthropic-style for Messages.

    ProxyError (500 server_error)
    ├── BadRequestError (400 invalid_request_error)
    ├── AuthenticationError (401 authentication_error)
    ├── ForbiddenError (403 permission_error)
    ├── NotFoundError (404 invalid_request_error)
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
        """The error as OpenAI's JSON (Keel's own routes; an API shape renders its own: `Shape.error_body`)."""
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


class NotFoundError(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


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


# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "request_timeout", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> bytes:
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def error_body(message: str, type_: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code, "param": param}})
