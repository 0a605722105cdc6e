"""What kuikproxy shows of itself over HTTP: ``/status`` and its schema (SPEC §8), ``/metrics``
(SPEC §9), and ``/``, the page for a person (:mod:`kuikproxy.observe.page`).

Each takes one :class:`~kuikproxy.runtime.snapshot.Snapshot` on the event loop, costing what it
shows, and builds and dumps its document in a worker thread: with a thousand hosts that is tens
of milliseconds the loop must not wait for.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kuikproxy.observe.observed import OBSERVED
from kuikproxy.observe.page import status_page
from kuikproxy.observe.status import DEFAULT_PAGE, MAX_PAGE, Clock, build_status, resource_page
from kuikproxy.observe.statusmodels import ConfigStatus, Status
from kuikproxy.runtime.snapshot import snapshot


def routes() -> list[web.RouteDef]:
    """The observing routes, for the composition root to add beside the data path's."""
    return [
        web.get("/", status_page),
        web.get("/status", status),
        web.get("/status/schema", status_schema),
        web.get("/metrics", metrics_page),
    ]


async def metrics_page(request: web.Request) -> web.StreamResponse:
    """``/metrics`` (SPEC §9), Prometheus text format."""
    body = await request.app[OBSERVED].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status_schema(request: web.Request) -> web.StreamResponse:
    """The JSON Schema of ``/status`` (SPEC §8), from the same pydantic models."""
    return web.json_response(Status.model_json_schema(by_alias=True))


async def status(request: web.Request) -> web.StreamResponse:
    """``/status`` (SPEC §8), narrowed by ``?resource=`` and ``?registry=``; resources come a
    page at a time (``?after=``, ``?limit=``), so that no status holds the loop for long."""
    observed = request.app[OBSERVED]
    pacer = observed.pacer
    query = request.query
    try:
        limit = int(query.get("limit", DEFAULT_PAGE))
    except ValueError:
        raise web.HTTPBadRequest(text="limit: not a number") from None
    page = resource_page(
        pacer.census,
        resource=query.get("resource"),
        after=query.get("after"),
        limit=min(max(limit, 1), MAX_PAGE),
    )
    registry = query.get("registry")
    # ?registry= shows one host: the others are not viewed at all
    hosts = None if registry is None else (registry,)
    snap = snapshot(pacer, pacer.loop.time(), resources=page.names, hosts=hosts)
    loaded, clock = observed.loaded(), Clock(snap.wall_offset)
    # copied now: a reload changes it in place
    config = ConfigStatus(
        generation=loaded.generation, loadedAt=clock.rfc3339(loaded.at), lastError=loaded.error
    )

    def document() -> str:
        return build_status(snap, config=config, page=page, registry=registry).model_dump_json(
            by_alias=True
        )

    return web.json_response(text=await asyncio.to_thread(document))
