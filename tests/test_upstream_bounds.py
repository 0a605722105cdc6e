"""What kuikproxy keeps per registry host it talks to is bounded: hosts under a wildcard are
names clients make up."""

from __future__ import annotations

from kuikproxy.config import parse_config
from kuikproxy.upstream.auth import MAX_CHALLENGES, MAX_TOKENS, Challenge, TokenCache
from kuikproxy.upstream.client import AiohttpTransport
from kuikproxy.upstream.registries import MAX_SIGNERS, Registries


def test_tokens_and_challenges_are_bounded_oldest_out() -> None:
    """Tokens per (host, scope) and challenges per host stay under their bounds however many
    hosts and repositories are asked, the oldest forgotten first; a live token is kept while
    there is room."""
    cache = TokenCache()
    for n in range(MAX_TOKENS + 50):
        cache.put(f"h{n % 100}.example", f"repository:r{n}:pull", "t", 300.0, 0.0)
    assert len(cache) <= MAX_TOKENS
    assert cache.get("h49.example", f"repository:r{MAX_TOKENS + 49}:pull", 1.0) == "t"
    for n in range(MAX_CHALLENGES + 50):
        cache.challenged(f"h{n}.example", Challenge("bearer", {"realm": "http://realm"}))
    assert len(cache.challenges) == MAX_CHALLENGES
    assert "h0.example" not in cache.challenges
    assert f"h{MAX_CHALLENGES + 49}.example" in cache.challenges


async def test_tls_contexts_and_signers_do_not_grow_with_hosts() -> None:
    """Hosts under a wildcard share the default's TLS settings: no context is kept per host;
    credentials' fingerprints are kept for at most ``MAX_SIGNERS`` hosts."""
    config = parse_config(
        'defaultRegistry: r.test\nallowedHosts: ["*.example"]\nregistries: {r.test: {}}\n'
    )
    transport = AiohttpTransport()
    registries = Registries(config, transport, clock=lambda: 0.0)
    for n in range(5000):
        assert registries.tls(f"h{n}.example") is True
        assert registries.signer(f"h{n}.example") is None
    tls, signers = registries.kept_per_host()
    assert tls == 0 and signers <= MAX_SIGNERS
    await transport.close()
