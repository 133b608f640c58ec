"""Suites by name: the built-ins (gsm8k, humaneval, mmlu, structured, ifeval, bfcl, banking77,
snips, and mixed: their items among open-ended prompts), plugins, JSONL files, and the items of an
imported run (`eval import`).

Plugins register through the entry-point group ``tierroute.suites``: each entry point names a
callable ``register_suites(register)``, and ``register(name, factory)`` adds a zero-argument
factory. The built-ins register the same way. A name that ends in ``.jsonl`` (or starts with
``jsonl:``) is a user's suite file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evals.suites.base import AnswerKey, Item, Suite
from router.errors import ConfigError
from router.plugins import SUITES as ENTRY_POINT_GROUP
from router.plugins import Registry

SuiteFactory = Callable[[], Suite]


def register_builtin_suites(register: Callable[[str, SuiteFactory], None]) -> None:
    from evals.suites.banking77 import Banking77
    from evals.suites.bfcl import BFCL
    from evals.suites.gsm8k import GSM8K
    from evals.suites.humaneval import HumanEval
    from evals.suites.ifeval import IFEval
    from evals.suites.mixed import Mixed
    from evals.suites.mmlu import MMLU
    from evals.suites.snips import Snips
    from evals.suites.structured import Structured

    register("gsm8k", GSM8K)
    register("humaneval", HumanEval)
    register("mmlu", MMLU)
    register("mixed", Mixed)
    register("structured", Structured)
    register("ifeval", IFEval)
    register("bfcl", BFCL)
    register("banking77", Banking77)
    register("snips", Snips)


class SuiteRegistry(Registry[SuiteFactory]):
    kind = "suite"


def _registry() -> SuiteRegistry:
    reg = SuiteRegistry()
    reg.load(ENTRY_POINT_GROUP)
    return reg


def suite_names() -> list[str]:
    return _registry().names()


def get_suite(name: str) -> Suite:
    """A suite by registered name, or a JSONL file by path."""
    if name.startswith("jsonl:") or name.endswith(".jsonl"):
        from evals.suites.imported import ITEMS_FILE, ImportedSuite
        from evals.suites.jsonl import JsonlSuite

        path = Path(name.removeprefix("jsonl:"))
        if path.name == ITEMS_FILE and (path.parent / "manifest.json").is_file():
            return ImportedSuite(path)  # an imported run's items (`eval import`), read back by `eval train`

        return JsonlSuite(name.removeprefix("jsonl:"))
    factories = _registry()
    if name not in factories:
        raise ConfigError(f"unknown suite '{name}'; known: {', '.join(factories.names())}, or a path to a .jsonl file")
    return factories.get(name)()


__all__ = ["AnswerKey", "Item", "Suite", "get_suite", "suite_names", "register_builtin_suites"]
