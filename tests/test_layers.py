"""The layers of docs/architecture.md, checked on the source: who may import whom.

Rules (one direction of calls):

- every module imports Raylane's own code through the ``raylane`` namespace
  (never a bare ``orchestrator``, ``api``, ``jobs`` or ``client``: installed,
  those names would collide with a user's own packages);
- ``api/`` imports no Ray module (it talks to Ray only through the orchestrator);
- ``jobs/`` (code that runs inside Ray) imports neither the store nor ``api/``;
- ``orchestrator/`` never imports ``api/``;
- ``api/`` imports no ``store/`` or ``backends/`` module (it calls the services,
  which hold the store and Ray), and nothing of ``client/`` (the server is not
  the SDK's user);
- ``backends/`` imports no ``store/`` (an adapter to Ray knows no database);
- ``loops/`` imports no ``services/`` (the services start the loops, not the other
  way round);
- ``store/`` imports neither the ``raylane`` package nor ``migrations/`` (Alembic
  runs ``migrations/env.py``, which imports the store: a circle no import
  graph shows);
- no import cycle between Raylane's own modules, computed from the import graph
  (every import in a module, a lazy one inside a function too);
- the client (``client/``, ``raylane/__init__``, and every Raylane module they
  import, followed transitively) imports no server dependency;
- only ``orchestrator/store/`` and ``migrations/`` import SQLAlchemy;
- each error is defined once: a class named like one of
  ``orchestrator/domain/errors.py`` anywhere else (the SDK's ``NotFound``, ...)
  subclasses it, so the SDK and the server do not drift apart in what it means.
  The client may import ``orchestrator/domain/`` (it imports no server dependency).

And the installed distribution puts only the ``raylane`` namespace into
site-packages (a wheel built from the tree is read, not installed). The
namespace is mapped onto the top-level folders by pyproject.toml's package-dir,
not linked under ``raylane/`` (issue 44): every folder is listed there, and a
checkout that is only on ``sys.path`` imports all of it from itself.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "api", "jobs", "client", "migrations")
SERVER_DEPS = ("ray", "sqlalchemy", "fastapi", "starlette", "uvicorn", "alembic", "psycopg", "pydantic_settings",
               "prometheus_client", "limits", "redis")


def imports_of(source: str) -> list[tuple[int, str]]:
    """(line, module) for every import in a source, relative imports made absolute
    only as far as the rules need (Raylane uses none)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
            # `from raylane.orchestrator import store` imports a module too
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _top(module: str) -> str:
    return module.split(".")[0]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(rel: str, source: str) -> list[str]:
    """What a file at ``rel`` (a path relative to the repo root) breaks."""
    room = rel.split("/")[0]
    parts = rel.split("/")
    area = parts[1] if room == "orchestrator" and len(parts) > 2 else None  # orchestrator/<area>/...
    found = []
    for line, mod in imports_of(source):
        where = f"{rel}:{line} imports {mod}"
        if _top(mod) in PACKAGES:
            found.append(f"{where}: use the raylane namespace (raylane.{mod})")
        if room == "api" and _top(mod) == "ray":
            found.append(f"{where}: api/ imports no Ray module")
        if room == "jobs" and (_under(mod, "raylane.orchestrator.store") or _under(mod, "raylane.api")):
            found.append(f"{where}: jobs/ imports neither the store nor api/")
        if room == "orchestrator" and _under(mod, "raylane.api"):
            found.append(f"{where}: orchestrator/ never imports api/")
        if room == "api" and (_under(mod, "raylane.orchestrator.store") or _under(mod, "raylane.orchestrator.backends")):
            found.append(f"{where}: api/ imports no store/ or backends/ module (it calls the services)")
        if room == "api" and _under(mod, "raylane.client"):
            found.append(f"{where}: api/ imports nothing of client/")
        if area == "backends" and _under(mod, "raylane.orchestrator.store"):
            found.append(f"{where}: backends/ imports no store/ module")
        if area == "loops" and _under(mod, "raylane.orchestrator.services"):
            found.append(f"{where}: loops/ imports no services/ module")
        if area == "store" and (mod == "raylane" or _under(mod, "raylane.migrations")):
            found.append(f"{where}: store/ imports neither the raylane package nor migrations/ (whose env.py "
                         f"imports the store)")
        if _top(mod) == "sqlalchemy" and not (rel.startswith("orchestrator/store/") or room == "migrations"):
            found.append(f"{where}: only orchestrator/store/ and migrations/ import SQLAlchemy")
    return found


def module_of(rel: str) -> str:
    """The ``raylane.*`` name of a source file (a package's ``__init__`` is the package)."""
    name = "raylane." + rel[:-len(".py")].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _type_checking_lines(source: str) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks: imports for the type checker only."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each module of ``sources`` (relative path -> text) -> the modules of ``sources``
    it imports, anywhere in it (a lazy import inside a function is an edge too: it
    still ties the two modules together; one under ``if TYPE_CHECKING:`` is not,
    it never runs)."""
    known = {module_of(rel): rel for rel in sources}
    graph: dict[str, set[str]] = {}
    for rel, source in sources.items():
        me = module_of(rel)
        typing_only = _type_checking_lines(source)
        graph[me] = {mod for line, mod in imports_of(source)
                     if mod in known and mod != me and line not in typing_only}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of a graph: its strongly connected components of more than
    one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def source_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_file(module: str) -> Path | None:
    """The file of a ``raylane.*`` module in this tree, or None."""
    if not _under(module, "raylane"):
        return None
    parts = module.split(".")[1:]
    base = ROOT.joinpath(*parts) if parts else ROOT / "raylane"
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def client_closure() -> dict[str, list[tuple[int, str]]]:
    """Every Raylane file the client imports (transitively), with its imports."""
    todo = [ROOT / "raylane" / "__init__.py", *sorted((ROOT / "client").rglob("*.py"))]
    seen: dict[str, list[tuple[int, str]]] = {}
    while todo:
        f = todo.pop()
        rel = str(f.relative_to(ROOT))
        if rel in seen:
            continue
        seen[rel] = imports_of(f.read_text())
        for _, mod in seen[rel]:
            # Each parent package's __init__ runs too.
            parts = mod.split(".")
            for i in range(1, len(parts) + 1):
                p = module_file(".".join(parts[:i]))
                if p is not None:
                    todo.append(p)
    return seen


def test_the_tree_keeps_the_import_rules():
    broken = [v for rel in source_files() for v in violations(rel, (ROOT / rel).read_text())]
    assert not broken, "\n".join(broken)


def test_no_import_cycle_between_raylanes_modules():
    graph = import_graph({rel: (ROOT / rel).read_text() for rel in source_files()})
    assert len(graph) > 100  # the whole tree, not an empty walk
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_catches_a_cycle_lazy_imports_included():
    sources = {
        "orchestrator/store/transitions.py": "from raylane.orchestrator.store import dependencies\n",
        "orchestrator/store/dependencies.py": "def f():\n    from raylane.orchestrator.store.transitions import t\n",
        "orchestrator/store/jobs.py": "from raylane.orchestrator.store import transitions\n",
        "orchestrator/domain/states.py": "import enum\n",
    }
    assert cycles(import_graph(sources)) == [["raylane.orchestrator.store.dependencies",
                                             "raylane.orchestrator.store.transitions"]]
    del sources["orchestrator/store/dependencies.py"]
    assert cycles(import_graph(sources)) == []
    # An import for the type checker only never runs: no edge.
    sources["orchestrator/store/dependencies.py"] = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                     "    from raylane.orchestrator.store.transitions import t\n")
    assert cycles(import_graph(sources)) == []


def test_the_client_imports_no_server_dependency():
    broken = [f"{rel}:{line} imports {mod}" for rel, imps in client_closure().items() for line, mod in imps
              if _top(mod) in SERVER_DEPS]
    assert not broken, "the client install would need a server dependency:\n" + "\n".join(broken)
    assert "orchestrator/domain/specs.py" in client_closure()  # the closure really is followed


def class_names(source: str) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)}


def twins(found: dict[str, type], domain: dict[str, type]) -> list[str]:
    """Classes of ``found`` (a qualified name -> the class) named like a domain error
    without being one: neither subclasses the other, so the error is defined twice."""
    out = []
    for where, cls in sorted(found.items()):
        mine = domain.get(cls.__name__)
        if mine is not None and cls is not mine and not (issubclass(cls, mine) or issubclass(mine, cls)):
            out.append(f"{where} is not {mine.__module__}.{mine.__name__} (neither subclasses the other)")
    return out


def domain_errors() -> dict[str, type]:
    from raylane.orchestrator.domain import errors

    return {name: obj for name, obj in vars(errors).items()
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__}


def test_each_error_is_defined_once():
    import importlib

    domain = domain_errors()
    assert {"RaylaneError", "NotFound", "Conflict", "Forbidden", "Unauthorized", "RateLimited"} <= domain.keys()
    found = {}
    for rel in source_files():
        if rel == "orchestrator/domain/errors.py":
            continue
        for name in class_names((ROOT / rel).read_text()) & domain.keys():
            module = importlib.import_module(module_of(rel))
            found[f"{module.__name__}.{name}"] = getattr(module, name)
    assert "raylane.client.sdk.errors.NotFound" in found  # the walk reaches the SDK's errors
    assert not twins(found, domain), "\n".join(twins(found, domain))
    # Every SDK error, also one the server has no class for (WaitTimeout), is a RaylaneError of the domain.
    from raylane.client.sdk import errors as sdk

    assert issubclass(sdk.RaylaneError, domain["RaylaneError"])


def test_the_twin_check_catches_an_error_defined_twice():
    domain = domain_errors()
    again = type("NotFound", (Exception,), {})
    assert twins({"raylane.client.x.NotFound": again}, domain) == [
        "raylane.client.x.NotFound is not raylane.orchestrator.domain.errors.NotFound (neither subclasses the other)"]
    assert twins({"raylane.client.x.NotFound": type("NotFound", (domain["NotFound"],), {}),
                  "raylane.client.x.Unrelated": type("Unrelated", (Exception,), {})}, domain) == []


@pytest.mark.parametrize("rel, source, rule", [
    ("api/routers/x.py", "import ray\n", "api/ imports no Ray module"),
    ("api/routers/x.py", "from ray.job_submission import JobStatus\n", "api/ imports no Ray module"),
    ("jobs/x.py", "from raylane.orchestrator.store import db\n", "jobs/ imports neither"),
    ("jobs/x.py", "from raylane.orchestrator import store\n", "jobs/ imports neither"),
    ("jobs/x.py", "from raylane.api.deps import CP\n", "jobs/ imports neither"),
    ("orchestrator/loops/x.py", "import raylane.api.app\n", "orchestrator/ never imports api/"),
    ("orchestrator/loops/x.py", "from sqlalchemy import select\n", "only orchestrator/store/"),
    ("api/routers/x.py", "import sqlalchemy as sa\n", "only orchestrator/store/"),
    ("client/x.py", "from orchestrator.domain.specs import JobSpec\n", "raylane namespace"),
    ("api/app.py", "from raylane.orchestrator.store.epoch_reader import SQLiteEpoch\n", "api/ imports no store/"),
    ("api/routers/jobs.py", "from raylane.orchestrator.store import jobs\n", "api/ imports no store/"),
    ("api/errors.py", "from raylane.orchestrator.backends.ray_jobs import RayUnavailable\n", "api/ imports no store/ or backends/"),
    ("api/cli.py", "from raylane.client.terminal import console\n", "api/ imports nothing of client/"),
    ("orchestrator/backends/lanes.py", "from raylane.orchestrator.store.db import StoreError\n", "backends/ imports no store/"),
    ("orchestrator/loops/notifier.py", "from raylane.orchestrator.services.webhooks import resolve\n", "loops/ imports no services/"),
    ("orchestrator/store/migrate.py", "from raylane import migrations\n", "store/ imports neither the raylane package"),
])
def test_each_rule_catches_a_break(rel, source, rule):
    assert any(rule in v for v in violations(rel, source)), violations(rel, source)


def test_allowed_imports_pass():
    assert violations("orchestrator/store/x.py", "from sqlalchemy import select\n") == []
    assert violations("migrations/versions/x.py", "import sqlalchemy as sa\n") == []
    assert violations("jobs/x.py", "import ray\nfrom raylane.orchestrator.domain.specs import JobSpec\n") == []
    assert violations("api/routers/x.py", "from raylane.orchestrator.services.controlplane import ControlPlane\n") == []
    assert violations("orchestrator/services/x.py", "from raylane.orchestrator.store import db\n") == []
    assert violations("orchestrator/loops/x.py", "from raylane.orchestrator.backends.base import RayBackend\n") == []


def test_the_distribution_installs_only_the_raylane_namespace(tmp_path):
    """A wheel built from the tree (as ``pip install raylane`` would get it) holds
    ``raylane/`` and its metadata only: no top-level ``jobs``, ``api``, ``client``,
    ``orchestrator``, ``migrations`` or ``examples``, and the server's data files."""
    from tests.test_sdk import _copy_tree

    src = tmp_path / "src"
    _copy_tree(ROOT, src)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("raylane-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"raylane"}, sorted(tops)
    for needed in ("raylane/orchestrator/domain/states.py", "raylane/jobs/run.py", "raylane/api/ui/app.js",
                   "raylane/orchestrator/domain/profiles/local.yaml", "raylane/migrations/versions/0001_initial.py"):
        assert needed in names, needed
    # Every file of the mapped folders, under its folder's name in the namespace.
    missing = [f for f in _tree_files() if f"raylane/{f}" not in names]
    assert not missing, missing


def _tree_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
                  if p.is_file() and not _skipped(p))


def _skipped(p: Path) -> bool:
    return any(part == "__pycache__" or part.startswith(".") for part in p.relative_to(ROOT).parts) \
        or p.suffix == ".pyc"


def _setuptools_config() -> tuple[list[str], dict[str, str]]:
    """pyproject.toml's [tool.setuptools] packages and package-dir (read as text:
    no tomllib on Python 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r"^\[tool\.setuptools\]\npackages = \[(.*?)\]", text, re.S | re.M)
    table = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    assert listed and table, "pyproject.toml: [tool.setuptools] packages and [tool.setuptools.package-dir]"
    return (re.findall(r'"([^"]+)"', listed.group(1)),
            dict(re.findall(r'^"([^"]+)"\s*=\s*"([^"]+)"', table.group(1), re.M)))


def test_the_namespace_is_mapped_not_linked():
    """``raylane.orchestrator`` and its siblings are the top-level folders through
    pyproject.toml's package-dir, not links under ``raylane/`` (links break on
    checkouts that do not keep them and give every file two paths). Every folder
    of theirs is listed as a package, data-only ones too: one left out would be
    missing from the wheel (and the image) while an editable install still finds it."""
    import raylane

    assert sorted(p.name for p in (ROOT / "raylane").iterdir() if not _skipped(p)) == ["__init__.py"]
    packages, dirs = _setuptools_config()
    assert dirs == {"raylane": "raylane", **{f"raylane.{pkg}": pkg for pkg in PACKAGES}}, dirs
    assert sorted(raylane._SUBPACKAGES) == sorted(PACKAGES)
    folders = {"raylane"} | {".".join(("raylane", *d.relative_to(ROOT).parts)) for pkg in PACKAGES
                             for d in (ROOT / pkg, *(ROOT / pkg).rglob("*")) if d.is_dir() and not _skipped(d)}
    assert not folders - set(packages), f"add to [tool.setuptools] packages: {sorted(folders - set(packages))}"
    assert not set(packages) - folders, f"no such folder: {sorted(set(packages) - folders)}"


def test_a_checkout_on_sys_path_imports_its_own_code(tmp_path):
    """A checkout that is only on ``sys.path`` (a benchmark's ``tree``, Alembic's
    ``prepend_sys_path``, a job that ships a checkout as its working_dir) imports
    every ``raylane`` module from itself, even in an interpreter that has another
    checkout installed in editable mode (this one, under make setup)."""
    other = tmp_path / "other"
    for pkg in ("raylane", *PACKAGES):
        shutil.copytree(ROOT / pkg, other / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    code = ("import raylane, raylane.api, raylane.client.sdk, raylane.jobs, raylane.migrations.versions, "
            "raylane.orchestrator.domain.states as s, raylane.orchestrator.store.migrate as m; "
            "print(raylane.__file__, raylane.api.__file__, raylane.client.sdk.__file__, raylane.jobs.__file__, "
            "raylane.migrations.versions.__file__, s.__file__, m.__file__, m.MIGRATIONS_DIR / 'env.py')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={**env, "PYTHONPATH": str(other)})
    assert out.returncode == 0, out.stderr[-3000:]
    files = out.stdout.split()
    assert len(files) == 8 and all(Path(f).is_file() and Path(f).is_relative_to(other) for f in files), files


def test_the_server_and_a_driver_do_not_load_the_client_sdk():
    """``raylane/__init__`` resolves its SDK names lazily: the API process and every
    Ray driver (``raylane.jobs.run``) import ``raylane.*`` without paying for the SDK,
    while ``from raylane import Client`` still works."""
    import subprocess
    import sys

    code = ("import sys, raylane.api.app, raylane.jobs.run; "
            "print(sorted(m for m in sys.modules if m.startswith('raylane.client')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout
    out = subprocess.run([sys.executable, "-c", "from raylane import Client, JobStatus; print(Client.__module__)"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip().startswith("raylane.client.sdk.")  # the package client/sdk/ (sync.py)
