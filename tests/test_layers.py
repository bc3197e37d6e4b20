"""The map of the package checks itself (issue 33.4): every module is in an import
contract of ``[tool.importlinter]`` (pyproject.toml), so that ``lint-imports`` sees each
of its imports, and the package has no import circle.

A layers contract says nothing of a module it does not name: before this test, 13
modules were in none, and the circle ``load/clients.py`` <-> ``load/open_loop.py``
passed while the docs said there was none."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = "pytest_storagescale"


def _contracts() -> list[dict]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["tool"]["importlinter"]["contracts"]


def package_modules(folder: Path = ROOT / PACKAGE) -> list[str]:
    """Every module of the package, from the file tree (a package is its folder's
    ``__init__.py``); a module not imported by any other is listed too."""
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _layer_names(layer: str) -> list[str]:
    """The modules of one layer entry: ``a | b`` (independent) or ``a : b``."""
    return [name.strip() for part in layer.split("|") for name in part.split(":")
            if name.strip()]


def containers(contracts: list[dict]) -> dict[str, set[str]]:
    """Each layers contract's container -> the names its layers give (relative)."""
    named: dict[str, set[str]] = {}
    for contract in contracts:
        if contract["type"] != "layers":
            continue
        for container in contract["containers"]:
            for layer in contract["layers"]:
                named.setdefault(container, set()).update(_layer_names(layer))
    return named


def outside_contracts(modules: list[str], contracts: list[dict]) -> list[str]:
    """The modules no contract checks. A module under a container (a package with a
    layers contract) must be named by that container's layers, itself or the package
    it is in below the container (``drivers.http`` names ``drivers.http.transport``):
    a module a layers contract does not name may import anything. The root package
    (the public names, imported on first use) is the container of all."""
    named = containers(contracts)
    missing = []
    for module in modules:
        if module == PACKAGE:
            continue
        parents = [container for container in named if module.startswith(container + ".")]
        if not parents:
            missing.append(module)
        for container in parents:
            below = module.removeprefix(container + ".").split(".")[0]
            if below not in named[container]:
                missing.append(module)
                break
    return missing


def test_every_module_of_the_package_is_in_an_import_contract():
    missing = outside_contracts(package_modules(), _contracts())
    assert not missing, (
        f"modules in no import contract (add each to its container's layers in "
        f"pyproject.toml [tool.importlinter]): {', '.join(missing)}")


def test_a_new_module_in_no_contract_is_named(tmp_path):
    """The check itself: a module its container's contract does not name fails by name;
    a module inside a package the contract names is covered by it."""
    package = tmp_path / PACKAGE
    for path in ("__init__.py", "load/__init__.py", "load/engine.py", "load/new.py",
                 "drivers/__init__.py", "drivers/http/__init__.py",
                 "drivers/http/transport.py", "errors.py", "stray.py"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text("")
    contracts = [
        {"type": "layers", "containers": [PACKAGE], "layers": ["load", "drivers | errors"]},
        {"type": "layers", "containers": [f"{PACKAGE}.load"], "layers": ["engine"]},
        {"type": "layers", "containers": [f"{PACKAGE}.drivers"], "layers": ["http"]},
        {"type": "forbidden", "source_modules": [f"{PACKAGE}.stray"],
         "forbidden_modules": ["pytest"]},
    ]
    assert outside_contracts(package_modules(package), contracts) == [
        f"{PACKAGE}.load.new", f"{PACKAGE}.stray"]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # imports under TYPE_CHECKING and inside functions count, as for lint-imports
    return grimp.build_graph(PACKAGE, cache_dir=None)


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The package's import circles: every strongly connected group of more than one
    module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append(
                        (other, iter(sorted(graph.find_modules_directly_imported_by(other)))))
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        circles.append(sorted(group))
    return circles


def test_the_package_has_no_import_circle(graph):
    """What docs/architecture.md and pyproject.toml say: no module imports, directly or
    through others, one that imports it (the container packages' ``__init__.py``
    included, which their own layers contracts do not check)."""
    assert import_circles(graph) == []


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    """The check itself, on a package whose two modules import each other lazily and
    a third under TYPE_CHECKING."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from . import b\n")
    (package / "b.py").write_text("from . import a\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = import_circles(grimp.build_graph("circled", cache_dir=None))
    assert found == [["circled.a", "circled.b"]]


def test_the_settings_and_the_server_monitor_import_no_server():
    """``config.py`` parses the embedded server's names only (the plugin checks them
    against the registered servers), and the servers' side of a step, which serves
    remote storage too, is ``load/server_monitor.py``: neither imports ``servers/``
    (before: config imported ``servers.family`` at its top, the monitor was
    ``servers/monitor.py``)."""
    code = ("import sys\n"
            "import pytest_storagescale.config, pytest_storagescale.load.server_monitor\n"
            "print(sorted(m for m in sys.modules if m.startswith('pytest_storagescale.serv')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["[]"]


def test_the_help_still_names_the_registered_servers_and_a_bad_one_is_refused(pytester):
    help_text = " ".join(pytester.runpytest("--help").stdout.str().split())
    assert re.search(r"--storage-embedded=\S+ .*Registered: xrootd \(default\), ceph",
                     help_text), help_text[:2000]
    result = pytester.runpytest("--storage-embedded-protocol", "nfs")
    assert result.ret != 0
    assert ("--storage-embedded-protocol: unknown value 'nfs'. Valid values: root,"
            in result.stdout.str() + result.stderr.str())
