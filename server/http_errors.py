"""One error shape for every Tidal HTTP API: `{"error": "...", "field": "..."}`.

A client (or an operator with curl) always gets a JSON body naming what was wrong, never
FastAPI's nested default or a traceback.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError


def error_response(
    status: int, message: str, field: str | None = None, **headers: str
) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


def first_invalid(
    error: RequestValidationError | ValidationError, skip: str = "body"
) -> JSONResponse:
    """A 422 naming the first invalid field (`loc` minus the `body` prefix)."""
    first = error.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    return error_response(422, f"{field or 'body'}: {first.get('msg', 'invalid')}", field)


class ApiError(Exception):
    """Raised anywhere in a request: becomes `error_response(status, message, field)`."""

    def __init__(self, status: int, message: str, field: str | None = None, **headers: str):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return first_invalid(error)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error.status, error.message, error.field, **error.headers)
