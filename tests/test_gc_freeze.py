"""The server hides what start-up made from the garbage collector (``gc.freeze``,
setting ``gc_freeze``) and gives it back when the app stops."""

from __future__ import annotations

import gc

import pytest
from fastapi.testclient import TestClient

from raylane.api.app import create_app

from tests.conftest import ADMIN_HEADERS


@pytest.mark.parametrize("freeze", [True, False])
def test_the_app_freezes_what_startup_made_and_unfreezes_at_stop(settings, cp, freeze):
    settings = settings.model_copy(update={"gc_freeze": freeze})
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    with TestClient(create_app(settings, cp=cp), headers=ADMIN_HEADERS) as c:
        # The modules, the app and the control plane are out of the collector's sight.
        assert (gc.get_freeze_count() > 10_000) is freeze, gc.get_freeze_count()
        assert c.post("/v1/jobs", json={"name": "a", "kind": "command", "entrypoint": "true"}).status_code == 201
    assert gc.get_freeze_count() == 0


def test_two_apps_in_one_process_unfreeze_when_the_last_stops(settings, cp):
    settings = settings.model_copy(update={"gc_freeze": True})
    gc.unfreeze()
    first = TestClient(create_app(settings, cp=cp), headers=ADMIN_HEADERS)
    second = TestClient(create_app(settings, cp=cp), headers=ADMIN_HEADERS)
    with first:
        with second:
            assert gc.get_freeze_count() > 10_000
        assert gc.get_freeze_count() > 10_000  # the first app still runs: still frozen
        assert first.get("/healthz").status_code == 200
    assert gc.get_freeze_count() == 0
