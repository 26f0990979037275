"""Errors of the simulated shell.

    tidal_base.errors.TidalError
    └── tidal_base.errors.InvalidInput
        └── TraceError      a trace file is missing, empty or malformed; the message
                            names the file and, where one is at fault, the line

The `simulate` and `tidal` commands print these in one line and exit with status 2.
"""

from tidal_base.errors import InvalidInput


class TraceError(InvalidInput):
    """A trace cannot be read; the message names the file and line."""
