import asyncio
import pytest
from kuikproxy.config import parse_config
from kuikproxy.web.app import build_app, PACER

pytestmark = pytest.mark.looptime

@pytest.mark.parametrize("kw", [{}, {"keepalive_timeout": 75.0}])
async def test_loris(aiohttp_client, kw):
    client = await aiohttp_client(build_app(parse_config("defaultRegistry: registry.test\nregistries:\n  registry.test: {upstream: 'http://127.0.0.1:9'}\n")), server_kwargs={"handler_cancellation": True, **kw})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    reader, writer = await asyncio.open_connection(client.host, client.port)
    data = b"GET /v2/app/manifests/t HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100000
    closed_at = None
    for i, byte in enumerate(data):
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except (ConnectionError, OSError) as e:
            closed_at = loop.time() - t0; print("write error", e); break
        await asyncio.sleep(1)
        if reader.at_eof() or writer.transport.is_closing():
            closed_at = loop.time() - t0; break
        if i > 5000: break
    print(kw, "closed at", closed_at, reader.at_eof(), reader._buffer[:200] if hasattr(reader, "_buffer") else None)
    writer.close()
