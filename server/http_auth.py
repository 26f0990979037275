"""Bearer-token auth for the writes of every Tidal API (the control plane's, and a
standalone worker's `PUT /v1/config`).

One token per process (`server.api_token`); compared in constant time; with no token
configured, protected endpoints are refused (403), never open.
"""

from __future__ import annotations

import hmac

from fastapi import Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.api_token import TOKEN_ENV
from server.http_errors import ApiError

BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description=f"The API token ({TOKEN_ENV} or --token-file of the server).",
)
"""The OpenAPI security scheme of protected endpoints (Swagger's Authorize button)."""


class TokenCheck:
    """Bearer-token auth: 401 without a token, 403 with a wrong one (or none configured).

    A FastAPI dependency: `dependencies=[Depends(TokenCheck(token))]`."""

    def __init__(self, token: str | None) -> None:
        self.token = token.encode() if token else None

    async def __call__(
        self, credentials: HTTPAuthorizationCredentials | None = Security(BEARER)
    ) -> None:
        error = self.refusal(None if credentials is None else f"Bearer {credentials.credentials}")
        if error is not None:
            raise error

    def refusal(self, authorization: str | None) -> ApiError | None:
        """Why a request with this `Authorization` header is refused, or None. Also asked
        by `server.http_edge.EdgeGuard`, before a protected request's body is read."""
        if self.token is None:
            return ApiError(
                403,
                "this endpoint needs an API token and none is configured "
                f"(set {TOKEN_ENV} or --token-file)",
            )
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return ApiError(
                401, "missing bearer token", "authorization", **{"WWW-Authenticate": "Bearer"}
            )
        if not hmac.compare_digest(credentials.strip().encode(), self.token):
            return ApiError(403, "wrong bearer token", "authorization")
        return None
