"""Errors raised by the batching core.

    TidalError                  base of every error Tidal raises on purpose
    └── InvalidInput(ValueError) a value, spec or file a user gave is not acceptable;
                                the message names the field (or file and line) and the value

Shells catch `TidalError` at their outermost loop and report it in one line; anything
else is a bug and keeps its traceback.
"""


class TidalError(Exception):
    """Base class of the errors Tidal raises deliberately."""


class InvalidInput(TidalError, ValueError):
    """A user-supplied value is invalid; the message says which and why."""


class PolicyInUse(TidalError):
    """A policy object already decides for another controller: its state is on that
    controller's clock, so a new controller builds a fresh one from the spec."""
