"""A serving process sets Python's garbage collector for a proxy once start-up is done; an app a
test (or an embedding) makes leaves the collector as it found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from conftest import keel_config, tenant

from proxy import gcposture
from proxy.app import create_app
from proxy.server import served


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to the collector is undone after it."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


async def start_and_stop(served_app: bool) -> tuple[tuple[int, int, int], int]:
    app = create_app(keel_config(tenant("http://127.0.0.1:9/v1")))
    if served_app:
        app = served(app)
    async with app.router.lifespan_context(app):
        return gc.get_threshold(), gc.get_freeze_count()


async def test_a_served_app_freezes_start_up_and_sets_the_threshold(collector: None) -> None:
    """What start-up built is frozen (never walked again) and the threshold is Keel's."""
    threshold, frozen = await start_and_stop(served_app=True)
    assert threshold == gcposture.THRESHOLD
    assert frozen > 10_000  # the app, its config, the modules it imported


async def test_an_app_made_in_process_leaves_the_collector_alone(collector: None) -> None:
    before = gc.get_threshold()
    assert await start_and_stop(served_app=False) == (before, 0)


async def test_keel_gc_default_keeps_pythons_setting(collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_GC", "default")
    before = gc.get_threshold()
    assert await start_and_stop(served_app=True) == (before, 0)
