"""Suites by name: the built-ins (gsm8k, humaneval, mmlu), plugins, and JSONL files.

Plugins register through the entry-point group ``tierroute.suites``: each entry point names a
callable ``register_suites(register)``, and ``register(name, factory)`` adds a zero-argument
factory. The built-ins register the same way. A name that ends in ``.jsonl`` (or starts with
``jsonl:``) is a user's suite file.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from evals.suites.base import AnswerKey, Item, Suite
from router.errors import ConfigError

ENTRY_POINT_GROUP = "tierroute.suites"
SuiteFactory = Callable[[], Suite]


def register_builtin_suites(register: Callable[[str, SuiteFactory], None]) -> None:
    from evals.suites.gsm8k import GSM8K
    from evals.suites.humaneval import HumanEval
    from evals.suites.mmlu import MMLU

    register("gsm8k", GSM8K)
    register("humaneval", HumanEval)
    register("mmlu", MMLU)


def _registry() -> dict[str, SuiteFactory]:
    factories: dict[str, SuiteFactory] = {}

    def register(name: str, factory: SuiteFactory) -> None:
        if name in factories:
            raise ConfigError(f"suite '{name}' registered twice")
        factories[name] = factory

    register_builtin_suites(register)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()(register)
    return factories


def suite_names() -> list[str]:
    return sorted(_registry())


def get_suite(name: str) -> Suite:
    """A suite by registered name, or a JSONL file by path."""
    if name.startswith("jsonl:") or name.endswith(".jsonl"):
        from evals.suites.jsonl import JsonlSuite

        return JsonlSuite(name.removeprefix("jsonl:"))
    factories = _registry()
    if name not in factories:
        raise ConfigError(f"unknown suite '{name}'; known: {', '.join(sorted(factories))}, or a path to a .jsonl file")
    return factories[name]()


__all__ = ["AnswerKey", "Item", "Suite", "get_suite", "suite_names", "register_builtin_suites"]
