"""Where a process's API token comes from: `--token-file`, else `$TIDAL_API_TOKEN`.

Kept apart from `server.http_auth` (which needs FastAPI) so that command lines can name
the variable in their help and load the token without loading the web stack.
"""

from __future__ import annotations

import os
from pathlib import Path

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
