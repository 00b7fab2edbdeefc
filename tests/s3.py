"""An S3 endpoint on loopback for tests: moto's server mode in this process, on a
free port, with one bucket made through boto3, as a MinIO or AWS bucket would be
made by an operator. Jobs reach it as they would reach real object storage:
through ``RAYLANE_STORAGE_URI`` / ``_ENDPOINT_URL`` / ``_ENV`` (fake credentials;
moto checks none)."""

from __future__ import annotations

import contextlib
import socket
import uuid
from dataclasses import dataclass

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "raylane-test-key", "AWS_SECRET_ACCESS_KEY": "raylane-test-secret",
               "AWS_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=CREDENTIALS["AWS_REGION"],
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        s3 = S3(endpoint=f"http://127.0.0.1:{port}", bucket=f"raylane-{uuid.uuid4().hex[:8]}")
        s3.client().create_bucket(Bucket=s3.bucket)
        yield s3
    finally:
        server.stop()
