"""Tidal's errors: `TidalError`, the base of every error Tidal raises on purpose, and
the tree of every exception class Tidal defines, drawn here whole (as httpx draws its own).

Each class lives in the module that raises it, so this leaf imports nothing of Tidal;
`tests/test_errors.py` keeps the drawing true (every exception class in Tidal's packages
is drawn, under its real bases, with its module, and is a `TidalError` or drawn outside).

    TidalError                    tidal_base.errors: the base; never raised itself
    ├── InvalidInput(ValueError)  tidal_base.errors: a value, spec or file a user gave is
    │   │                         not acceptable; the message names the field (or file
    │   │                         and line) and the value
    │   ├── TraceError            simulations.errors: a trace file is missing, empty or
    │   │                         malformed
    │   └── InsufficientHistory   server.control.plane: too little recorded traffic for
    │                             the rollout gate to judge (the API answers 409)
    ├── PolicyInUse               tidal_base.errors: a policy object given to a controller
    │                             already decides for another one
    ├── MalformedStats            server.bus.wire: a stats entry on the bus this reader
    │                             cannot use; the reader skips it
    ├── ApiError                  server.http_errors: a request refused (404, 409, 422,
    │                             503, a bad token); answered in the one JSON error shape
    ├── ConfigRejected            server.engines.protocols: an engine refused a config;
    │                             the one it ran before serves on
    ├── EngineUnreachable         server.engines.member: an engine did not answer, an
    │   │                         outage: its member reports it not ready and retries
    │   └── TritonUnreachable     server.engines.triton: Triton did not answer
    ├── TritonNotAvailable        server.engines.triton_local: the bundled tritonserver
    │                             cannot be found or started
    ├── QueueFull                 server.worker.batching: the worker's bounded queue is
    │                             full (HTTP 429)
    ├── DeadlineExceeded          server.worker.batching: a request's deadline passed
    │                             while it was queued (HTTP 504)
    ├── ShuttingDown              server.worker.batching: the worker is draining (HTTP 503)
    └── WorkerFailed              server.worker.batching: the dispatch loop died (HTTP 503)

Two stay outside `TidalError`, each for the reason its docstring gives:

    Exception
    ├── TickFailed                server.control.loop: a control tick's stage raised (a
    │                             bug included); the loop counts it by stage, ticks on
    └── OutOfMemory               server.worker.runner: a batch did not fit in device
                                  memory; the batcher splits it

Shells catch `TidalError` at their outermost loop and report it in one line (`tidal` and
`simulate` exit with status 2); anything else is a bug and keeps its traceback.
"""


class TidalError(Exception):
    """Base class of the errors Tidal raises deliberately."""


class InvalidInput(TidalError, ValueError):
    """A user-supplied value is invalid; the message says which and why."""


class PolicyInUse(TidalError):
    """A policy object already decides for another controller: its state is on that
    controller's clock, so a new controller builds a fresh one from the spec."""
