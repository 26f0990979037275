"""The system programs the suite runs for real, installed the way a new machine needs them.

Some tests start a real `redis-server` and `prometheus` (with its `promtool`) on free
ports, and drive Debian's Chromium with Playwright. A fresh Debian machine has none of
them, so the suite installs what is missing before the first test, with apt-get, when it
runs as root (CI does, and so does a newcomer following the README); otherwise it stops
at once with the one command to run. So the README's test command needs nothing else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SystemProgram:
    """A program a test runs, and the Debian package that provides it."""

    path_or_name: str  # an absolute path, or a name looked up on PATH
    package: str

    def present(self) -> bool:
        if self.path_or_name.startswith("/"):
            return os.access(self.path_or_name, os.X_OK)
        return shutil.which(self.path_or_name) is not None


PROGRAMS = (
    SystemProgram("redis-server", "redis-server"),
    SystemProgram("prometheus", "prometheus"),
    SystemProgram("promtool", "prometheus"),
    # Playwright drives Debian's build (tests/test_console.py): it cannot download its own.
    SystemProgram("/usr/bin/chromium", "chromium"),
)


class MissingPrograms(RuntimeError):
    """Programs the suite needs are missing and cannot be installed from here."""


def missing_packages(programs: tuple[SystemProgram, ...] = PROGRAMS) -> list[str]:
    """The Debian packages whose programs are not on this machine, each once."""
    return sorted({p.package for p in programs if not p.present()})


def ensure_installed(report=print) -> list[str]:
    """Install the missing packages with apt-get (as root); returns what was installed.
    Raises MissingPrograms with the command to run where that cannot be done."""
    packages = missing_packages()
    if not packages:
        return []
    # Wait for another apt (a second test session on the same machine) rather than fail.
    wait = ["-o", "DPkg::Lock::Timeout=600"]
    command = ["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends", *packages]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise MissingPrograms(
            f"the suite needs {', '.join(packages)}: run `sudo apt-get update && sudo "
            f"{' '.join(command)}` (or `bash .ci/run` as root)"
        )
    report(f"installing the Debian packages the tests run: {' '.join(packages)} ...")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", *wait, "update", "-qq"], command):
        done = subprocess.run(step, env=environment, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise MissingPrograms(f"`{' '.join(step)}` failed: {' '.join(tail)}")
    still = missing_packages()
    if still:
        raise MissingPrograms(f"installed, but still missing: {', '.join(still)}")
    return packages


def chromium() -> Path:
    """Debian's Chromium, which tests/test_console.py drives."""
    return Path(PROGRAMS[-1].path_or_name)
