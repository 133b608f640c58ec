"""Every command's `--help` prints: argparse %-formats each help line when it is shown, so one
stray "%" (as in "95%/99%") made `tierroute eval --help` a traceback without any test noticing."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from router.cli.main import build_parser


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def find(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


ALL = list(parsers(build_parser()))


def test_every_command_is_walked() -> None:
    assert ("eval", "workloads") in ALL and ("keys", "create") in ALL and len(ALL) > 20


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "tierroute")
def test_help_prints(path: tuple[str, ...]) -> None:
    text = find(path).format_help()
    assert text.startswith("usage: ")
