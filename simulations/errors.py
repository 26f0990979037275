"""Errors of the simulated shell.

    adaptive.errors.TidalError
    └── adaptive.errors.InvalidInput
        └── TraceError      a trace file is missing, empty or malformed; the message
                            names the file and, where one is at fault, the line

The `simulate` and `tidal` commands print these in one line and exit with status 2.
"""

from adaptive.errors import InvalidInput


class TraceError(InvalidInput):
    """A trace cannot be read; the message names the file and line."""
