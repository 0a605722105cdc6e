import asyncio
import pytest
from aiohttp.test_utils import TestClient
from kuikproxy.config import parse_config
from kuikproxy.web.app import build_app
from tests.web.raw import exchange

pytestmark = pytest.mark.looptime

R = "?ns=registry.test"
CASES = [
    b"GET /v2/../x/manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/app/../../manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/app/%2e%2e/%2e%2e/manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/./app/manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/app%2fx/manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET //v2/app/manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2//app/manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"POST /v2/app/blobs/uploads/" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    b"OPTIONS /v2/app/manifests/t" + R.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\nConnection: close\r\n\r\n",
    b"GET http://evil.example/v2/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    b"GET http://evil.example/v2/App/manifests/t HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    b"GET /v2/app\x00/manifests/t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(200)) + b"Connection: close\r\n\r\n",
    b"GET /v2/" + b"a/" * 5000 + b"manifests/t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\nKuik-Resource: a\x01b\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\nKuik-Resource: a\x7fb\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\nKuik-Resource: a\x1b[31mb\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\nKuik-Resource: a\tb\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.0\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/2.0\r\nHost: x\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t\r\n\r\n",
    b"G\x01T /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/App/manifests/t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
    b"GET /v2/app/manifests/t?ns=registry.test%0d%0aX-Injected:%201 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/app/manifests/t?ns= HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/app/manifests/t?ns=x%20y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v3/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v2/app/manifests/t HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * 100_000 + b"\r\nConnection: close\r\n\r\n",
]

async def test_scratch(registry, aiohttp_client):
    fake, server = registry
    text = f"defaultRegistry: registry.test\nregistries:\n  registry.test:\n    upstream: http://127.0.0.1:{server.port}\n    check: {{interval: 200ms}}\n    copy: {{interval: 200ms, idle: 0s}}\n"
    client = await aiohttp_client(build_app(parse_config(text)), server_kwargs={"handler_cancellation": True})
    for data in CASES:
        n = len(fake.seen)
        ex = await exchange(client.host, client.port, data, timeout=3)
        r = ex.responses[0] if ex.responses else None
        print(repr(data[:70]), "->", r and (r.version, r.status, r.reason, r.body[:150]), ex.closed, ex.rest[:100], fake.seen[n:])
