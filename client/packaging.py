"""A working directory zipped on the client, to be uploaded as a code package
(``raylane.orchestrator.domain.packages``): how code reaches the cluster from a
laptop, with no filesystem shared with the server.

Invariants:

- *deterministic*: the same tree gives the same bytes, so the same sha256 (files
  in sorted order, fixed timestamps and modes, one compression level), and a
  tree already uploaded is not sent again;
- *what is left out*: every ``.gitignore`` in the tree (git's rules: ``#``,
  ``!``, a trailing ``/`` for directories, a ``/`` inside anchors to that file's
  directory, ``*``, ``?``, ``**``, ``[...]``), then ``DEFAULT_EXCLUDES``, then
  the caller's excludes (the same syntax, from the tree's root; they win over a
  ``.gitignore``'s ``!``). A left-out directory is not entered. Symlinked
  directories are not followed; a symlinked file is zipped as its content;
- *size*: the files' total size is checked against the limit before anything
  is zipped; too large raises ``PackageTooLarge`` naming the directory and its
  biggest files;
- files sit at the zip's top level, as Ray unpacks a ``gcs://`` working dir.

Imports the standard library only (the light client install).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# What nobody means to ship: VCS data, caches, virtualenvs, Raylane's own state.
DEFAULT_EXCLUDES = (".git/", ".hg/", ".svn/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".raylane/",
                    ".ipynb_checkpoints/", ".pytest_cache/", ".mypy_cache/", ".DS_Store")
# The server's default RAYLANE_PACKAGE_MAX_BYTES: checked here first, so a tree
# the server would refuse is refused before a byte is sent.
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
BIGGEST_SHOWN = 5  # files named in a too-large message
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can hold: no clock in the hash
COMPRESS_LEVEL = 6


class PackageTooLarge(ValueError):
    """The tree is larger than the limit; nothing was zipped or sent."""


@dataclass(frozen=True)
class Package:
    root: Path
    data: bytes
    sha256: str
    files: int
    size_bytes: int  # the files' total size before compression


@dataclass(frozen=True)
class _Rule:
    base: str  # the directory of the .gitignore, relative to the root ("" for the root)
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    anchored: bool  # matched against the path from ``base``; else against the name alone


def _translate(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == len(glob):
            out.append("/.*")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and (j := _class_end(glob, i)) > 0:
            body = glob[i + 1:j]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j + 1
        elif glob[i] == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def _class_end(glob: str, i: int) -> int:
    """Index of the ``]`` closing the class opened at ``i``; -1 if none (then ``[`` is literal)."""
    j = i + 1
    if j < len(glob) and glob[j] == "!":
        j += 1
    if j < len(glob) and glob[j] == "]":
        j += 1
    return glob.find("]", j)


def parse_rules(lines: Iterable[str], base: str = "") -> list[_Rule]:
    """gitignore lines as rules for paths under ``base``."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        line = line.rstrip(" ") if not line.endswith("\\ ") else line
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        rules.append(_Rule(base, re.compile(_translate(line) + r"\Z", re.DOTALL), negate, dir_only, anchored))
    return rules


def ignored(rules: list[_Rule], rel: str, is_dir: bool) -> bool:
    """Whether ``rel`` (a path from the root, ``/``-separated) is left out: the last rule that matches decides."""
    out = False
    name = rel.rsplit("/", 1)[-1]
    for r in rules:
        if r.dir_only and not is_dir:
            continue
        if r.base:
            if not rel.startswith(r.base + "/"):
                continue
            sub = rel[len(r.base) + 1:]
        else:
            sub = rel
        if r.regex.match(sub if r.anchored else name):
            out = not r.negate
    return out


def list_files(root: Path, excludes: Iterable[str] = (), *, gitignore: bool = True) -> list[tuple[str, Path]]:
    """(path in the zip, file on disk) of every file the package holds, sorted."""
    root = Path(root)
    tail = parse_rules(DEFAULT_EXCLUDES) + parse_rules(excludes)
    found: list[tuple[str, Path]] = []

    def walk(directory: Path, rel_dir: str, rules: list[_Rule]) -> None:
        if gitignore and (directory / ".gitignore").is_file():
            rules = rules + parse_rules((directory / ".gitignore").read_text(errors="replace").splitlines(), rel_dir)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if ignored(rules + tail, rel, is_dir):
                continue
            if is_dir:
                walk(Path(entry.path), rel, rules)
            elif entry.is_file(follow_symlinks=True):
                found.append((rel, Path(entry.path)))

    walk(root, "", [])
    return found


def build(root: str | os.PathLike[str], *, excludes: Iterable[str] = (), max_bytes: int = DEFAULT_MAX_BYTES,
          gitignore: bool = True) -> Package:
    """Zip the tree at ``root``.

    Raises:
        NotADirectoryError: ``root`` is not a directory.
        PackageTooLarge: the files left in add up to more than ``max_bytes``.
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"working dir {root} is not a directory")
    files = list_files(root, excludes, gitignore=gitignore)
    sizes = [(p.stat().st_size, rel) for rel, p in files]
    total = sum(s for s, _ in sizes)
    if total > max_bytes:
        biggest = ", ".join(f"{rel} ({_mib(s)})" for s, rel in sorted(sizes, key=lambda t: (-t[0], t[1]))[:BIGGEST_SHOWN])
        raise PackageTooLarge(f"working dir {root} holds {_mib(total)} in {len(files)} files, more than the "
                              f"{_mib(max_bytes)} allowed; biggest: {biggest}. Leave files out with .gitignore "
                              f"or --exclude, or put data in object storage")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL) as zf:
        for rel, path in files:
            info = zipfile.ZipInfo(rel, ZIP_DATE)
            executable = path.stat().st_mode & stat.S_IXUSR
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes(), compresslevel=COMPRESS_LEVEL)
    data = buf.getvalue()
    return Package(root=root, data=data, sha256=hashlib.sha256(data).hexdigest(), files=len(files),
                   size_bytes=total)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"
