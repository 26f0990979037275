import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from system_packages import MissingPrograms, ensure_installed


def pytest_sessionstart(session: pytest.Session) -> None:
    """Install the system programs the tests run (redis-server, prometheus, Chromium)
    before the first test, as a fresh machine needs: tests/system_packages.py."""
    try:
        ensure_installed()
    except MissingPrograms as error:
        pytest.exit(f"tests: {error}", returncode=3)
