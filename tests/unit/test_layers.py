"""The layers below the workers do not import from `dataloader.workers`, read from the source
(every import counts: at module level, under `TYPE_CHECKING`, inside a function).

A task definition (`dataloader.tasks`), the client, the rules of `core/`, the SQL of `storage/`
and the metrics serve producers and readers that run no worker: they import nothing from
`workers/`, not even through another module of the package. The HTTP API and `health.py` import
nothing from it themselves; they reach it only through what runs the workers in the service
(`runner.py`, `maintenance/`) and the task contracts (`contract.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "dataloader"
WORKERS = "dataloader.workers"

#: Modules and packages (paths under `src/dataloader`) that import nothing from the workers,
#: directly or through any module they import.
BELOW_WORKERS = (
    "base.py",
    "client.py",
    "config.py",
    "context.py",
    "exceptions.py",
    "metrics.py",
    "tasks.py",
    "core",
    "logger",
    "storage",
)
#: Modules and packages that import nothing from the workers themselves.
NOT_IMPORTING_WORKERS = (*BELOW_WORKERS, "api", "health.py", "dashboard")
#: What the dashboard may not import: it reads and acts through a `Client` only (no SQL, no
#: store, no driver, no reach into the worker manager or the service's internals).
DASHBOARD_FORBIDDEN = (
    "dataloader.storage",
    "dataloader.workers",
    "dataloader.maintenance",
    "dataloader.context",
    "dataloader.runner",
    "asyncpg",
    "sqlalchemy",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(path: Path) -> list[tuple[str, int]]:
    """(module, line) of each import of the file `path`."""
    source = path.read_text(encoding="utf-8")
    return imports_of(source, module_name(path), package=path.name == "__init__.py")


def imports_of(source: str, name: str, *, package: bool = False) -> list[tuple[str, int]]:
    """(module, line) of each import of `source`, the module `name`: `from a import b` counts
    as `a.b` when that is a module, else as `a`; relative imports are resolved."""
    parent = name.split(".") if package else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = parent[: len(parent) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in MODULES else base, node.lineno))
    return found


def is_workers(module: str) -> bool:
    return module == WORKERS or module.startswith(WORKERS + ".")


def files(*roots: str) -> list[Path]:
    """The source files of `roots` (modules or packages under `src/dataloader`)."""
    found: list[Path] = []
    for root in roots:
        path = PACKAGE / root
        assert path.exists(), f"{root} is gone: update the layers of this test"
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def direct_offences(path: Path) -> list[str]:
    """Each import of the workers in `path`, once per line and module."""
    offences = (
        f"{path.relative_to(SRC)}:{line} imports {module}"
        for module, line in imported(path)
        if is_workers(module)
    )
    return list(dict.fromkeys(offences))


def chain_to_workers(path: Path) -> list[str] | None:
    """The modules from `path`'s to the first of `dataloader.workers` it reaches through its
    imports within the package (the package's `__init__`, the public facade, excepted), or None.
    """
    start = module_name(path)
    reached_from: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        current = todo.pop(0)
        for module, _ in imported(MODULES[current]):
            if module in reached_from or module not in MODULES or module == "dataloader":
                continue
            reached_from[module] = current
            if is_workers(module):
                chain = [module]
                while (previous := reached_from[chain[-1]]) is not None:
                    chain.append(previous)
                return chain[::-1]
            todo.append(module)
    return None


def relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


@pytest.mark.parametrize("path", files(*NOT_IMPORTING_WORKERS), ids=relative)
def test_imports_nothing_from_the_workers(path: Path) -> None:
    offences = direct_offences(path)
    assert not offences, "; ".join(offences)


@pytest.mark.parametrize("path", files(*BELOW_WORKERS), ids=relative)
def test_reaches_no_worker_module_through_its_imports(path: Path) -> None:
    chain = chain_to_workers(path)
    assert chain is None, " imports ".join(chain)


def test_an_import_of_the_workers_is_found_wherever_it_is() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from dataloader.workers.pipelines import registry\n"
        "if TYPE_CHECKING:\n"
        "    from dataloader.workers.batches import HandlerStats\n"
        "def later() -> None:\n"
        "    import dataloader.workers.manager\n"
        "    from ..workers import job_context\n"
    )
    found = [hit for hit in imports_of(source, "dataloader.core.example") if is_workers(hit[0])]
    assert found == [
        ("dataloader.workers.pipelines.registry", 2),
        ("dataloader.workers.batches", 4),
        ("dataloader.workers.manager", 6),
        ("dataloader.workers.job_context", 7),
    ]


@pytest.mark.parametrize("path", files("dashboard"), ids=relative)
def test_the_dashboard_reads_and_acts_through_the_client_only(path: Path) -> None:
    offences = [
        f"{path.relative_to(SRC)}:{line} imports {module}"
        for module, line in imported(path)
        if any(module == f or module.startswith(f + ".") for f in DASHBOARD_FORBIDDEN)
    ]
    assert not offences, "; ".join(offences)
