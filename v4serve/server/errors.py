"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

from __future__ import annotations


class APIError(Exception):
    """An error answered to the client; `param` names the offending request field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_field(param: str, rule: str) -> APIError:
    """A 400 for one field: the message starts with the field's name."""
    return APIError(f"{param}: {rule}", param=param)


def server_error(message: str) -> APIError:
    return APIError(message, status=500, type="server_error", code="internal_error")
