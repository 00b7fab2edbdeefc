"""Packages: a job's code uploaded by the client, named by the sha256 of its zip.

Words:

- *tree*: the client's directory, as the client zips it (``raylane.client.packaging``);
- *package*: that zip, stored by the control plane under its sha256 (hex, 64
  lower-case digits); the same tree gives the same bytes, so the same name;
- *package URI*: ``raylane://packages/<sha256>``, what a spec's
  ``runtime_env.working_dir`` says to run a job in an uploaded package;
- *Ray URI*: ``gcs://_ray_pkg_<sha256>.zip``, the name the control plane gives the
  package in Ray's own package store when it hands it over at dispatch.

Pure: imported by the client, the API, the dispatcher and the policy.
"""

from __future__ import annotations

import re

PACKAGE_URI_PREFIX = "raylane://packages/"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PACKAGE_URI_RE = re.compile(r"^raylane://packages/([0-9a-f]{64})$")
RAY_PACKAGE_PREFIX = "_ray_pkg_"  # Ray's own prefix for packages it unpacks (runtime_env packaging)


def package_uri(sha256: str) -> str:
    return PACKAGE_URI_PREFIX + sha256


def is_package_uri(value: str) -> bool:
    """True for anything in the ``raylane://`` scheme (well formed or not)."""
    return value.lower().startswith("raylane://")


def package_sha(value: str) -> str | None:
    """The sha256 a package URI names; None if ``value`` is not a well-formed one."""
    m = PACKAGE_URI_RE.match(value)
    return m.group(1) if m else None


def ray_package_name(sha256: str) -> str:
    """The package's file name in Ray's GCS package store."""
    return f"{RAY_PACKAGE_PREFIX}{sha256}.zip"
