import asyncio
import pytest
from kuikproxy.config import parse_config
from kuikproxy.web.app import build_app, PACER
from tests.web.raw import exchange, RawServer, reset

pytestmark = pytest.mark.looptime

async def blob_reset(req, reader, writer):
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n" + b"x" * 500)
    await writer.drain()
    await asyncio.sleep(0.05)
    reset(writer)

async def hang(req, reader, writer):
    await asyncio.Event().wait()

async def garbage(req, reader, writer):
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01\x02garbage\r\n\r\n")
    await writer.drain()
    writer.close()

async def close_now(req, reader, writer):
    writer.close()

B = "sha256:" + "b" * 64
async def test_scratch(aiohttp_client):
    srv = await RawServer({"/bad-reset": blob_reset, B: blob_reset, "/hang": hang, "/garbage": garbage, "/close": close_now}).start()
    text = f"registries:\n  bad.test:\n    upstream: http://127.0.0.1:{srv.port}\n    check: {{interval: 200ms, timeout: 1s}}\n    copy: {{interval: 200ms, idle: 0s, timeout: 1s}}\n"
    client = await aiohttp_client(build_app(parse_config(text)), server_kwargs={"handler_cancellation": True})
    loop = asyncio.get_running_loop()
    for path, heads in [("/v2/app/manifests/hang", 1), ("/v2/app/manifests/garbage", 1), ("/v2/app/manifests/close", 1), (f"/v2/app/blobs/{B}", 0), ("/v2/hang/blobs/sha256:" + "c"*64, 0), ("/v2/app/manifests/garbage", 0),("/v2/hang/manifests/x", 0)]:
        m = "HEAD" if heads else "GET"
        t0 = loop.time()
        ex = await exchange(client.host, client.port, f"{m} {path}?ns=bad.test HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), heads=heads, timeout=30)
        r = ex.responses[0] if ex.responses else None
        print(m, path, round(loop.time()-t0, 3), r and (r.status, r.body[480:700]), ex.closed, len(ex.rest), ex.rest[:120])
        st = await (await client.get("/status")).json()
        print("   ", st["registries"]["bad.test"]["check"]["busy"], st["registries"]["bad.test"]["copy"]["open"], client.server.app[PACER].held(), client.server.app[PACER].tasks)
    await srv.close()
