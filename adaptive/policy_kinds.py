"""The policy kinds and what each one's spec may say: its options, the kind of value each
takes and the largest plausible one.

Data and checks only, importing nothing heavy (no numpy), so that `simulate --help` can
list the kinds and their options from here. `adaptive.specs`, the registry, checks every
spec against its kind before building it: an unknown option is refused naming the known
ones, an implausible value (`max_batch=99999999999`, a batch timeout of hours) naming
the bound. The shells find here which options are durations, to warn about one written
as a bare number (`timeout=10` is 10 seconds).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from adaptive.config import MAX_BATCH_SIZE, MAX_TIMEOUT_S
from tidal_base.errors import InvalidInput
from tidal_base.specs import (
    Spec,
    option_duration,
    option_float,
    option_int,
    reject_unknown,
)

MAX_SPAN_S = 30 * 86400.0
"""The longest plausible window, delay, lead, history or SLO a policy option may give."""

INT, NUMBER, DURATION, WORD = "N", "X", "DUR", "WORD"
"""What an option's value is: an integer, a number, a duration ("10ms"), or a word the
policy reads itself (its `words` say which)."""


@dataclass(frozen=True, slots=True)
class PolicyOption:
    """One option of a policy spec: `key=VALUE`, `value` one of INT, NUMBER, DURATION or
    WORD, in [low, high] when those are given (a duration may also be one of `words`)."""

    key: str
    value: str
    high: float | None = None
    low: float | None = None
    words: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.value not in (INT, NUMBER, DURATION, WORD):
            raise ValueError(f"option {self.key!r}: value must be N, X, DUR or WORD")

    def usage(self) -> str:
        """`max_batch=N`, `lead=auto|DUR`, `replicas=fixed|plan`."""
        shown = "|".join(self.words) if self.value == WORD else self.value
        if self.value != WORD and self.words:
            shown = "|".join((*self.words, self.value))
        return f"{self.key}={shown}"

    def check(self, spec: Spec) -> None:
        """The option's value as `spec` gives it: of the right kind, and in range."""
        if self.value == WORD or spec.options[self.key] in self.words:
            return  # the factory reads words itself, naming the choices
        if self.value == INT:
            self._check_range(spec, option_int(spec, self.key, 0), "{:,}".format)
        elif self.value == NUMBER:
            number = option_float(spec, self.key, 0.0)
            if not math.isfinite(number):
                raise InvalidInput(
                    f"{spec.kind} {spec.text!r}: {self.key} must be a finite number, "
                    f"got {spec.options[self.key]}"
                )
            self._check_range(spec, number, "{:g}".format)
        else:
            self._check_range(spec, option_duration(spec, self.key, 0.0), _show_duration)

    def _check_range(self, spec: Spec, value: float, show: Callable[[float], str]) -> None:
        high = math.inf if self.high is None else self.high
        low = -math.inf if self.low is None else self.low
        if low <= value <= high:
            return
        bound = f"in [{show(low)}, {show(high)}]" if self.low is not None else f"<= {show(high)}"
        raise InvalidInput(
            f"{spec.kind} {spec.text!r}: {self.key} must be {bound}, got {spec.options[self.key]}"
        )


def _show_duration(seconds: float) -> str:
    """A bound as people write it: 60s, 30d."""
    days = seconds / 86400
    return f"{days:g}d" if days >= 1 and days.is_integer() else f"{seconds:g}s"


@dataclass(frozen=True, slots=True)
class PolicyKind:
    """A policy kind: its name in specs, one line on what it does, its options."""

    name: str
    summary: str
    options: tuple[PolicyOption, ...]

    @property
    def keys(self) -> set[str]:
        """The option keys a spec of this kind may give."""
        return {option.key for option in self.options}

    def check(self, spec: Spec) -> None:
        """Unknown options refused naming the known ones; every value in range."""
        reject_unknown(spec, self.keys)
        for option in self.options:
            if option.key in spec.options:
                option.check(spec)

    def duration_keys(self) -> set[str]:
        """The keys whose values are durations, so that the shells can warn about one written as a
        bare number (`timeout=10` is 10 seconds)."""
        return {option.key for option in self.options if option.value == DURATION}


def _cap(key: str) -> PolicyOption:
    return PolicyOption(key, INT, MAX_BATCH_SIZE)


def _span(key: str, *words: str) -> PolicyOption:
    return PolicyOption(key, DURATION, MAX_SPAN_S, words=words)


_TIMEOUT = PolicyOption("timeout", DURATION, MAX_TIMEOUT_S)
_FRACTION = {"low": 0.0, "high": 1.0}
_PLANNING = (
    _span("lead", "auto"),
    _span("slo"),
    PolicyOption("margin", NUMBER),
    _span("step"),
    _span("history"),
    PolicyOption("replicas", WORD, words=("fixed", "plan")),
    PolicyOption("headroom", NUMBER),
    _span("scale_in"),
    PolicyOption("risk", NUMBER, low=0.0, high=0.49),
)

POLICY_KINDS: dict[str, PolicyKind] = {
    kind.name: kind
    for kind in (
        PolicyKind("static", "a fixed config", (_cap("max_batch"), _TIMEOUT, _cap("warm"))),
        PolicyKind(
            "aimd",
            "Clipper's AIMD: the cap grows while batches fill and run within budget of the "
            "SLO, and backs off when they do not",
            (
                _cap("start"),
                _cap("step"),
                PolicyOption("backoff", NUMBER),
                _TIMEOUT,
                _cap("max_batch"),
                PolicyOption("fill", NUMBER, **_FRACTION),
                PolicyOption("budget", NUMBER, **_FRACTION),
            ),
        ),
        PolicyKind(
            "reactive",
            "BentoML-style: from the measured rate and an online latency fit, no forecast",
            (PolicyOption("utilization", NUMBER), _cap("max_batch")),
        ),
        PolicyKind(
            "predictive",
            "Tidal's: plans for the forecast's upper bound and warms ahead of ramps "
            "(replicas=plan: the replica count too)",
            (*_PLANNING, PolicyOption("forecaster", WORD, words=("SPEC",))),
        ),
        PolicyKind(
            "oracle",
            "predictive with the recorded future as its forecast (simulation only)",
            _PLANNING,
        ),
        PolicyKind(
            "serve-autoscaler",
            "Ray Serve's default replica autoscaler over one static config",
            (
                _cap("max_batch"),
                _TIMEOUT,
                PolicyOption("target_ongoing", NUMBER),
                _span("look_back"),
                _span("upscale_delay"),
                _span("downscale_delay"),
                PolicyOption("factor", NUMBER),
            ),
        ),
        PolicyKind(
            "hpa",
            "a Kubernetes HPA on utilisation over one static config",
            (
                _cap("max_batch"),
                _TIMEOUT,
                PolicyOption("target", NUMBER),
                _span("period"),
                PolicyOption("tolerance", NUMBER, **_FRACTION),
                _span("window"),
            ),
        ),
        PolicyKind(
            "dynamo-planner",
            "NVIDIA Dynamo's SLA planner: replicas every interval from a load prediction and "
            "the profile, over one static config",
            (
                _cap("max_batch"),
                _TIMEOUT,
                PolicyOption("predictor", WORD, words=("constant", "arima", "kalman")),
                _span("interval"),
            ),
        ),
    )
}
"""Every policy kind the registry builds (a test checks the two agree)."""


def policy_kinds_help(width: int = 79) -> str:
    """The kinds, what each does and its options, for --help."""
    lines = ["policy kinds (KIND[:KEY=VALUE,...]; N an integer, X a number, DUR a duration):"]
    indent = " " * 20
    for kind in POLICY_KINDS.values():
        lines += textwrap.wrap(
            kind.summary, width, initial_indent=f"  {kind.name:<18}", subsequent_indent=indent
        )
        options = " ".join(option.usage() for option in kind.options)
        lines += textwrap.wrap(options, width, initial_indent=indent, subsequent_indent=indent)
    return "\n".join(lines)
