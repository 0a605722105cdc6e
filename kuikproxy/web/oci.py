"""OCI error bodies (SPEC §12) as aiohttp responses."""

from __future__ import annotations

import json

from aiohttp import web

from kuikproxy.errors import RegistryError

API_VERSION = ("Docker-Distribution-API-Version", "registry/2.0")


def error_response(error: RegistryError) -> web.Response:
    return web.Response(
        status=error.status,
        body=json.dumps(error.body()).encode(),
        content_type="application/json",
        headers={**error.headers(), API_VERSION[0]: API_VERSION[1]},
    )
