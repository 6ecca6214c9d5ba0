"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

from __future__ import annotations


class APIError(Exception):
    """An error answered to the client; `param` names the offending request field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code
        self.headers = headers  # extra response headers (Retry-After, WWW-Authenticate)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_field(param: str, rule: str) -> APIError:
    """A 400 for one field: the message starts with the field's name."""
    return APIError(f"{param}: {rule}", param=param)


def server_error(message: str) -> APIError:
    return APIError(message, status=500, type="server_error", code="internal_error")


def unauthorized() -> APIError:
    return APIError("Incorrect or missing API key: send the header 'Authorization: Bearer <key>'",
                    status=401, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def queue_full(num_queued: int, limit: int, retry_after_s: int) -> APIError:
    return APIError(f"the server is busy: {num_queued} requests are waiting (--max-queued-requests {limit}); "
                    f"retry after {retry_after_s} s", status=429, type="rate_limit_error",
                    code="rate_limit_exceeded", headers={"Retry-After": str(retry_after_s)})


def request_timeout(seconds: float) -> APIError:
    """`x-should-retry: false`: the openai client would otherwise retry a 408, and the same
    request would only time out again."""
    return APIError(f"the request did not finish within the server's limit of {seconds:g} s "
                    f"(--request-timeout); it was aborted", status=408, type="timeout_error",
                    code="request_timeout", headers={"x-should-retry": "false"})
