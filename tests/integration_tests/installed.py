"""What the README's install (`python3 -m venv .venv && pip install -e .`) brings, so that a
test can run a program with nothing more: dataloader's requirements without its extras, theirs
with the extras they ask for, and so on, plus what a new virtual environment holds (pip,
setuptools). The test environment has more (pytest, httpx …): a program run behind
`import_guard` cannot import any of it, as a newcomer's could not."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: A new virtual environment's own packages.
VENV = frozenset({"pip", "setuptools"})

GUARD = '''"""Refuses what `pip install -e .` does not bring (written by installed.py)."""
import sys
from importlib.abc import MetaPathFinder

NOT_INSTALLED = frozenset({names!r})


class _NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in NOT_INSTALLED:
            raise ModuleNotFoundError(
                f"No module named {{name!r}} (`pip install -e .` does not install it)", name=name
            )
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


@functools.cache
def installed_distributions(root: str = "dataloader") -> frozenset[str]:
    """The distributions `pip install root` brings (canonical names)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:  # a requirement of another platform
            continue
        for line in requires:
            requirement = Requirement(line)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            )
            if wanted:
                todo.append((requirement.name, frozenset(requirement.extras)))
    return frozenset(name for name, _ in seen) | VENV


@functools.cache
def not_installed_modules() -> frozenset[str]:
    """Top-level modules present here that only distributions outside the install provide."""
    installed = installed_distributions()
    return frozenset(
        module
        for module, distributions in metadata.packages_distributions().items()
        if not any(canonicalize_name(d) in installed for d in distributions)
    )


def import_guard(directory: Path) -> Path:
    """A directory to put on PYTHONPATH: a `sitecustomize` in it makes every module of
    `not_installed_modules` fail to import, in the process and in those it starts."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(not_installed_modules())
    (directory / "sitecustomize.py").write_text(GUARD.format(names=names), encoding="utf-8")
    return directory
