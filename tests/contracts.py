"""Custom import-linter contracts (``lint-imports`` loads them from ``pyproject.toml``).

``environment access``: only the listed modules (``gitxet.cli`` and ``gitxet.settings``) may
read or change the process environment. Everything else gets its settings passed in, so a
library user (fsspec, the plugins) and the CLI see the same values.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


@dataclass(frozen=True)
class EnvUse:
    """One place that touches the environment."""

    module: str
    line: int
    what: str


def env_uses(source: str, module: str) -> Iterator[EnvUse]:
    """Every ``os.environ``/``os.getenv``/``os.putenv``... in ``source`` (also through
    ``from os import environ`` or ``import os as x``)."""
    tree = ast.parse(source)
    os_names = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "os":
                    os_names.add(alias.asname or "os")
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "posix"):
            for alias in node.names:
                if alias.name in ENV_NAMES:
                    yield EnvUse(module, node.lineno, f"from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ENV_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id in os_names
        ):
            yield EnvUse(module, node.lineno, f"{node.value.id}.{node.attr}")


def _allowed(module: str, allowed: Iterable[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def violations(modules: Iterable[str], allowed: Iterable[str]) -> list[EnvUse]:
    """Environment uses in ``modules`` outside ``allowed`` (packages include submodules)."""
    allowed = list(allowed)
    found: list[EnvUse] = []
    for module in sorted(modules):
        if _allowed(module, allowed):
            continue
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as f:
            found.extend(env_uses(f.read(), module))
    return found


class EnvironmentContract(Contract):
    """Only ``allowed_modules`` may read or change ``os.environ`` (``os.getenv``, ...).

    Configuration options:
        - source_package: the package whose modules are checked.
        - allowed_modules: modules or packages that may touch the environment.
    """

    source_package = fields.StringField()
    allowed_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        root = str(self.source_package)
        modules = [m for m in graph.modules if m == root or m.startswith(root + ".")]
        found = violations(modules, [str(a) for a in self.allowed_modules])  # type: ignore[attr-defined]
        return ContractCheck(kept=not found, metadata={"uses": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for use in check.metadata["uses"]:
            output.print_error(
                f"{use.module}:{use.line} uses {use.what}: only "
                f"{', '.join(self.allowed_modules)} may read the environment"  # type: ignore[attr-defined]
            )
            output.new_line()
