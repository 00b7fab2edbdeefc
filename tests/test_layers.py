"""The layers of docs/architecture.md, checked on the source: who may import whom.

Rules (one direction of calls):

- every module imports Raylane's own code through the ``raylane`` namespace
  (never a bare ``orchestrator``, ``api``, ``jobs`` or ``client``: installed,
  those names would collide with a user's own packages);
- ``api/`` imports no Ray module (it talks to Ray only through the orchestrator);
- ``jobs/`` (code that runs inside Ray) imports neither the store nor ``api/``;
- ``orchestrator/`` never imports ``api/``;
- the client (``client/``, ``raylane/__init__``, and every Raylane module they
  import, followed transitively) imports no server dependency;
- only ``orchestrator/store/`` and ``migrations/`` import SQLAlchemy.

And the installed distribution puts only the ``raylane`` namespace into
site-packages (a wheel built from the tree is read, not installed).
"""

from __future__ import annotations

import ast
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
        if _top(mod) == "sqlalchemy" and not (rel.startswith("orchestrator/store/") or room == "migrations"):
            found.append(f"{where}: only orchestrator/store/ and migrations/ import SQLAlchemy")
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


def test_the_client_imports_no_server_dependency():
    broken = [f"{rel}:{line} imports {mod}" for rel, imps in client_closure().items() for line, mod in imps
              if _top(mod) in SERVER_DEPS]
    assert not broken, "the client install would need a server dependency:\n" + "\n".join(broken)
    assert "orchestrator/domain/specs.py" in client_closure()  # the closure really is followed


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
])
def test_each_rule_catches_a_break(rel, source, rule):
    assert any(rule in v for v in violations(rel, source)), violations(rel, source)


def test_allowed_imports_pass():
    assert violations("orchestrator/store/x.py", "from sqlalchemy import select\n") == []
    assert violations("migrations/versions/x.py", "import sqlalchemy as sa\n") == []
    assert violations("jobs/x.py", "import ray\nfrom raylane.orchestrator.domain.specs import JobSpec\n") == []


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
    assert out.stdout.strip() == "raylane.client.sdk"
