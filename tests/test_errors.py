"""One exception tree, drawn where `TidalError` is defined, and true.

Every module of Tidal's packages is imported and every exception class defined in them
is found; each must be drawn in `tidal_base/errors.py`'s docstring with its module and
its real bases, and be a `TidalError` unless it is drawn outside and named in
`OUTSIDE` with the reason. A class added, moved or re-parented without the drawing
fails here, and so does a drawing of a class that is gone.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass

import pytest

import tidal_base.errors
from tidal_base.errors import TidalError

PACKAGES = ("tidal_base", "forecaster", "adaptive", "simulations", "server")

OUTSIDE = {
    # Wraps whatever a control tick's stage raised, bugs included, to name the stage.
    "server.control.loop.TickFailed",
    # A device's limit, not a refusal: caught by the batcher and the warmer; where nothing
    # catches it (`tidal profile`) it keeps its traceback rather than becoming one line.
    "server.worker.runner.OutOfMemory",
}
"""Exception classes that are not `TidalError`s on purpose (each docstring says why)."""

_ENTRY = re.compile(
    r"^    (?P<tree>(?:[│ ]   )*)(?P<branch>[├└]── )?(?P<name>[A-Z]\w*)"
    r"(?:\((?P<also>[\w, ]+)\))?(?:\s{2,}(?P<module>[a-z_][\w.]*):|$)"
)


@dataclass(frozen=True)
class Drawn:
    """One class as the tree draws it."""

    name: str
    module: str | None  # None for a root from outside Tidal (`Exception`)
    bases: tuple[str, ...]  # the parent drawn, then the bases in parentheses


def drawn_tree(docstring: str) -> dict[str, Drawn]:
    """The classes drawn, by `module.name`; a root's base is `Exception`."""
    drawn, parents = {}, []
    for line in docstring.splitlines():
        entry = _ENTRY.match(line)
        if entry is None:
            continue
        depth = len(entry["tree"]) // 4 + (entry["branch"] is not None)
        del parents[depth:]
        also = tuple(b.strip() for b in (entry["also"] or "").split(",") if b.strip())
        parent = parents[-1] if parents else "Exception"
        if entry["module"] is not None:
            key = f"{entry['module']}.{entry['name']}"
            drawn[key] = Drawn(entry["name"], entry["module"], (parent, *also))
        parents.append(entry["name"])
    return drawn


def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in Tidal's packages, by `module.qualname`."""
    found = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.")]
        for name in names:
            module = importlib.import_module(name)
            for cls in _classes(vars(module).values(), name):
                if issubclass(cls, BaseException):
                    found[f"{name}.{cls.__qualname__}"] = cls
    return found


def _classes(values, module: str):
    """The classes among `values` defined in `module`, and the classes nested in them."""
    for value in values:
        if inspect.isclass(value) and value.__module__ == module:
            yield value
            yield from _classes(vars(value).values(), module)


@pytest.fixture(scope="module")
def defined() -> dict[str, type[BaseException]]:
    return defined_exceptions()


@pytest.fixture(scope="module")
def drawn() -> dict[str, Drawn]:
    return drawn_tree(tidal_base.errors.__doc__ or "")


def test_the_drawing_is_read(drawn: dict[str, Drawn]) -> None:
    """The parser sees the tree (a reformatted drawing must not pass by drawing nothing)."""
    assert drawn["tidal_base.errors.TidalError"].bases == ("Exception",)
    assert drawn["tidal_base.errors.InvalidInput"].bases == ("TidalError", "ValueError")
    assert drawn["simulations.errors.TraceError"].bases == ("InvalidInput",)
    assert drawn["server.engines.triton.TritonUnreachable"].bases == ("EngineUnreachable",)


def test_every_exception_class_is_drawn(defined: dict, drawn: dict[str, Drawn]) -> None:
    assert sorted(set(defined) - set(drawn)) == [], "draw these in tidal_base/errors.py"
    assert sorted(set(drawn) - set(defined)) == [], "drawn, but no such exception class"


def test_each_is_drawn_under_its_real_bases(defined: dict, drawn: dict[str, Drawn]) -> None:
    wrong = {
        key: (drawn[key].bases, bases)
        for key, cls in defined.items()
        if key in drawn and drawn[key].bases != (bases := tuple(b.__name__ for b in cls.__bases__))
    }
    assert wrong == {}, "drawn bases, real bases"


def test_every_exception_is_a_tidal_error_or_stays_outside_on_purpose(defined: dict) -> None:
    outside = {key for key, cls in defined.items() if not issubclass(cls, TidalError)}
    assert outside == OUTSIDE
    for key in OUTSIDE:
        assert "Not a `TidalError`" in (defined[key].__doc__ or ""), f"{key}: say why"
