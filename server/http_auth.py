"""Bearer-token auth for the writes of every Tidal API (the control plane's, and a
standalone worker's `PUT /v1/config`).

One token per process, from `--token-file` or `$TIDAL_API_TOKEN`; compared in constant
time; with no token configured, protected endpoints are refused (403), never open.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.http_errors import ApiError
from tidal_base.errors import InvalidInput

TOKEN_ENV = "TIDAL_API_TOKEN"


def api_token(token_file: Path | None) -> str | None:
    """The token from `token_file` (named `--token-file` in errors), else `$TIDAL_API_TOKEN`,
    else None."""
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    try:
        token = token_file.read_text().strip()
    except OSError as error:
        raise InvalidInput(f"--token-file {token_file}: {error.strerror}") from None
    if not token:
        raise InvalidInput(f"--token-file {token_file}: the file is empty")
    return token


class TokenCheck:
    """Bearer-token auth: 401 without a token, 403 with a wrong one (or none configured).

    A FastAPI dependency: `dependencies=[Depends(TokenCheck(token))]`."""

    def __init__(self, token: str | None) -> None:
        self.token = token.encode() if token else None
        self.bearer = HTTPBearer(auto_error=False)

    async def __call__(self, request: Request) -> None:
        credentials: HTTPAuthorizationCredentials | None = await self.bearer(request)
        if self.token is None:
            raise ApiError(
                403,
                "this endpoint needs an API token and none is configured "
                f"(set {TOKEN_ENV} or --token-file)",
            )
        if credentials is None:
            raise ApiError(
                401, "missing bearer token", "authorization", **{"WWW-Authenticate": "Bearer"}
            )
        if not hmac.compare_digest(credentials.credentials.encode(), self.token):
            raise ApiError(403, "wrong bearer token", "authorization")
