"""Answers to clients: a whole answer from the runtime, or an upstream answer streamed.

Blobs are streamed chunk by chunk, never buffered whole (R6). HEAD answers keep the registry's
``Content-Length`` and ``Docker-Content-Digest``: clients (containerd, skopeo) size and verify
by them.
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict

from kuikproxy.runtime.messages import Answer
from kuikproxy.upstream.client import UpstreamRequest, end_to_end
from kuikproxy.upstream.registries import Registries


def _client_headers(headers: CIMultiDict[str], ns: str | None) -> CIMultiDict[str]:
    if ns is not None:
        headers["OCI-Namespace"] = ns
    return headers


def answer_response(request: web.Request, answer: Answer, ns: str | None) -> web.StreamResponse:
    headers = _client_headers(CIMultiDict(answer.headers), ns)
    if request.method == "HEAD":  # no body: the registry's Content-Length stands
        return web.StreamResponse(status=answer.status, headers=headers)
    headers.pop("Content-Length", None)  # aiohttp sets it from the body
    return web.Response(status=answer.status, headers=headers, body=answer.body)


async def stream(
    request: web.Request,
    registries: Registries,
    host: str,
    upstream: UpstreamRequest,
    ns: str | None,
) -> web.StreamResponse:
    """Send ``upstream`` to ``host`` and relay its answer to the client as it arrives."""
    async with await registries.send(host, upstream) as answer:
        out = _client_headers(end_to_end(answer.headers), ns)
        response = web.StreamResponse(status=answer.status, headers=out)
        length = out.get("Content-Length")
        if length is not None and length.isdigit():
            response.content_length = int(length)
        await response.prepare(request)
        if request.method != "HEAD":
            async for chunk in answer.chunks():
                await response.write(chunk)
        await response.write_eof()
        return response
