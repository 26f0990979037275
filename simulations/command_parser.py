"""The argument parser `simulate` and `tidal` (and its subcommands) build on.

Two changes to argparse, for the person at the terminal:

- A mistake on the command line is one line naming the command, then where to look
  (`tidal worker: error: argument --port: invalid int value: 'x'`, then
  `see 'tidal worker --help'`), exit 2: not the whole usage first.
- A value that begins with '-' is taken as the value of an option that takes one:
  `--slo -5ms` reads as `--slo=-5ms` and gets the option's own message, where argparse
  would take `-5ms` for an option and say `expected one argument`. A word that is an
  option (`--slo --workers 4`) is left alone, so a forgotten value is still said so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """argparse's parser with one-line errors and values that begin with '-'; its
    subcommands' parsers are of this class too (`add_subparsers` uses the parent's)."""

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        words, innermost = dash_values_joined(self, sys.argv[1:] if args is None else args)
        namespace, extras = self.parse_known_args(words, namespace)
        if extras:  # said by the subcommand they were given to, not by `tidal`
            innermost.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nsee '{self.prog} --help'\n")


def dash_values_joined(
    parser: argparse.ArgumentParser, args: Sequence[str]
) -> tuple[list[str], argparse.ArgumentParser]:
    """`args` with each `--option -value` of an option that takes one value written
    `--option=-value`; and the parser of the innermost subcommand `args` name."""
    words: list[str] = []
    current = parser
    expecting = False  # the previous word is an option that takes one value
    for index, word in enumerate(args):
        if word == "--":
            words.extend(args[index:])
            break
        if expecting and word.startswith("-") and word != "-" and _option(current, word) is None:
            words[-1] = f"{words[-1]}={word}"
            expecting = False
            continue
        if expecting:
            expecting = False  # the value, whatever it says
            words.append(word)
            continue
        words.append(word)
        action = _option(current, word) if word.startswith("-") else None
        if action is not None:
            expecting = action.nargs is None and "=" not in word
        elif not word.startswith("-"):
            current = _subcommand(current, word) or current
    return words, current


def _option(parser: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    """The option `word` names in `parser` (`--opt` or `--opt=value`, or an unambiguous
    prefix as argparse allows), or None."""
    name = word.partition("=")[0]
    actions = parser._option_string_actions
    if name in actions:
        return actions[name]
    if not parser.allow_abbrev:
        return None
    matches = {actions[known] for known in actions if known.startswith(name)}
    return matches.pop() if len(matches) == 1 else None


def _subcommand(parser: argparse.ArgumentParser, word: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(word)
    return None
