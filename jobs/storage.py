"""A job's storage, seen from inside Ray: where what must outlive an attempt and
its node is written (checkpoints, Tune's experiment, batch outputs).

Words:
- *storage*: ``Storage``, the job's own prefix: a URI (``s3://bucket/p/<project>/<job>``,
  ``gs://...``) or an absolute path that every node mounts. The control plane
  chooses it (``Settings.resolved_storage_uri``); it is never under its data_dir.
- *endpoint*: an S3 endpoint that is not AWS's (MinIO, a test server), used for
  every ``s3://`` URI the job opens; credentials come from the process's
  environment (``AWS_*``, what ``RAYLANE_STORAGE_ENV`` gave the job) or the node.
- *scratch*: a node-local directory for what is being written before it is
  stored; it dies with the node, and nothing in it is relied on.

Invariants:
- ``filesystem(uri)`` is the one way runners open a URI, so the endpoint
  applies alike to Tune, Ray Data and the checkpoint copies below.
- A checkpoint is stored whole or not at all: ``put_dir`` writes its files, then
  its marker (``COMMITTED``); ``latest_checkpoint`` picks the newest directory
  with its marker, so a node lost mid-upload leaves no half checkpoint to resume from.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from raylane.orchestrator.domain.protocol import Env

COMMITTED = ".raylane-committed"  # written last into a stored checkpoint directory


def filesystem(uri: str, endpoint: str | None = None) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path in it)`` for a URI or a local path."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "s3" and endpoint:
        ep = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        fs = pafs.S3FileSystem(endpoint_override=ep.netloc, scheme=ep.scheme or "https",
                               region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        return fs, f"{parsed.netloc}{parsed.path}".rstrip("/")
    return pafs.FileSystem.from_uri(uri)


@dataclass(frozen=True)
class Storage:
    uri: str
    endpoint: str | None = None

    @classmethod
    def from_env(cls, env=os.environ) -> "Storage":
        return cls(env[Env.STORAGE], env.get(Env.STORAGE_ENDPOINT) or None)

    @property
    def local_path(self) -> Path | None:
        """The storage as a directory of this node, when it is one (a shared mount)."""
        if self.uri.startswith("file://"):
            return Path(self.uri[len("file://"):])
        return None if "://" in self.uri else Path(self.uri)

    def child(self, name: str) -> "Storage":
        sep = "" if self.uri.endswith("/") else "/"
        return Storage(f"{self.uri}{sep}{name}", self.endpoint)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        return filesystem(self.uri, self.endpoint)

    def ensure(self) -> None:
        """Create the storage where a directory must exist first (a path; object stores need none)."""
        if self.local_path is not None:
            self.local_path.mkdir(parents=True, exist_ok=True)

    # Checkpoints ---------------------------------------------------------------

    def latest_checkpoint(self, prefix: str = "checkpoint_") -> str | None:
        """The name of the newest complete checkpoint directory here, or None."""
        fs, path = self.filesystem()
        try:
            infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except FileNotFoundError:
            return None
        names = sorted(i.base_name for i in infos
                       if i.type == pafs.FileType.Directory and i.base_name.startswith(prefix))
        for name in reversed(names):
            if fs.get_file_info(f"{path}/{name}/{COMMITTED}").type == pafs.FileType.File:
                return name
        return None

    def put_dir(self, local: Path, name: str) -> None:
        """Store a local directory as ``<storage>/<name>``, its marker last."""
        fs, path = self.filesystem()
        dest = f"{path}/{name}"
        fs.create_dir(dest, recursive=True)
        pafs.copy_files(str(local), dest, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        with fs.open_output_stream(f"{dest}/{COMMITTED}") as f:
            f.write(b"")

    def get_dir(self, name: str, local: Path) -> Path:
        """Copy ``<storage>/<name>`` to ``local/<name>`` and return that directory."""
        fs, path = self.filesystem()
        out = local / name
        out.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(f"{path}/{name}", str(out), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        return out


def scratch_dir(label: str) -> Path:
    """A new node-local directory (see *scratch*); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=f"raylane-{label}-"))
