"""The fast path of kept answers (``web/fastpath.py``) stands aside on an aiohttp release it was
not checked against: the application is served entirely aiohttp's way."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from kuikproxy.web import fastpath


def test_only_the_aiohttp_releases_the_fast_path_was_checked_against_are_supported() -> None:
    assert [fastpath.supported(r) for r in ("3.14.0", "3.14.5")] == [True, True]
    assert not any(fastpath.supported(r) for r in ("3.9.5", "3.13.2", "3.15.0", "4.0.0"))
    assert fastpath.supported(aiohttp.__version__) == fastpath.SUPPORTED


def test_on_another_release_the_application_is_served_aiohttps_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fastpath, "SUPPORTED", False)
    app = web.Application()
    made = app._make_handler
    fastpath.serve_kept_answers(app)
    assert app._make_handler == made
