"""``kuikproxy inject-webhook``: the admission webhook's HTTPS edge.

``POST /mutate`` reads an ``AdmissionReview`` (:mod:`.review`), asks :mod:`.patch` what to do
with the pod, and answers: a malformed body ``400`` with the reason, anything else ``200``
and ``allowed: true``. ``GET /healthz`` and ``GET /readyz`` answer ``200`` for the kubelet's
probes. The API
server only calls webhooks over TLS; the certificate is re-read when its files change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from kuikproxy.config.models import _split_listen
from kuikproxy.errors import ConfigError
from kuikproxy.inject.patch import JSON, Injection, SidecarSettings
from kuikproxy.inject.review import Review, ReviewError, admit, parse, response

__all__ = ["ServingCertificate", "WebhookSettings", "build_app", "run"]

log = logging.getLogger(__name__)

MAX_REVIEW_BYTES = 4 * 1024**2
"""A review carries one pod, and etcd keeps no object above 1.5 MiB: room to spare, and a
bound on what a caller can make the webhook hold."""
CERTIFICATE_CHECK_INTERVAL = 60.0
"""Seconds between looks at the certificate files; cert-manager renews days before expiry."""
_SHOWN = 100  # characters of a pod's namespace and name in the log: it is not validated yet


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """``kuikproxy inject-webhook``'s flags, checked."""

    host: str
    """The address to bind; ``""``: every address."""
    port: int
    cert_file: Path
    key_file: Path
    sidecar: SidecarSettings

    @classmethod
    def parse(
        cls, listen: str, cert_file: str, key_file: str, sidecar: SidecarSettings
    ) -> WebhookSettings:
        """:class:`ConfigError` for a listen address that is not ``host:port``."""
        try:
            # the same rule as the config's ``listen``: [::1]:8443 for IPv6, :8443 for all
            host, port = _split_listen(listen)
        except ValueError as error:
            raise ConfigError([f"--listen: {error}"]) from None
        return cls(host, port, Path(cert_file), Path(key_file), sidecar)


class ServingCertificate:
    """The webhook's TLS certificate, re-read when its files change.

    cert-manager renews the Secret and the kubelet swaps the mounted files under a running
    webhook; one that kept its first certificate would be refused by the API server once it
    expired. The listening context hands each handshake to the newest context that loaded
    (its SNI callback runs for every ClientHello, with a server name or without), so a pair
    caught half-written is never served: the previous one stays until both files load.
    """

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self._files = (cert_file, key_file)
        try:
            self._signature = self._stat()
            self.context = self._load()
        except (OSError, ssl.SSLError) as error:
            raise ConfigError([f"--tls-cert-file/--tls-key-file: cannot load: {error}"]) from None
        self._current = self.context
        self.context.sni_callback = self._select

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        # the kubelet swaps in a new copy of the files by renaming a directory: the inode
        # changes even where the size and the modification time might not
        stats = [os.stat(path) for path in self._files]
        return tuple((stat.st_ino, stat.st_size, stat.st_mtime_ns) for stat in stats)

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*self._files)
        return context

    def _select(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        connection.context = self._current

    def reload_if_changed(self) -> bool:
        """Load the files if they changed since the last load; whether a new pair is served."""
        try:
            signature = self._stat()
            if signature == self._signature:
                return False
            context = self._load()
        except (OSError, ssl.SSLError) as error:
            log.warning("TLS certificate not reloaded, the current one stays: %s", error)
            return False
        self._current, self._signature = context, signature
        log.info("TLS certificate reloaded from %s", self._files[0])
        return True


SETTINGS = web.AppKey("settings", SidecarSettings)


def build_app(sidecar: SidecarSettings, certificate: ServingCertificate) -> web.Application:
    """The webhook's routes, with a task that reloads ``certificate`` while it serves."""
    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app[SETTINGS] = sidecar
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)  # both, as `serve` answers them, for either probe

    async def watch(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_reload_every(certificate, CERTIFICATE_CHECK_INTERVAL))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(watch)
    return app


async def _reload_every(certificate: ServingCertificate, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        certificate.reload_if_changed()


async def mutate(request: web.Request) -> web.StreamResponse:
    body = await request.read()  # over MAX_REVIEW_BYTES: 413, by aiohttp
    try:
        review = parse(body)
    except ReviewError as error:
        log.warning("admission request refused: %s", error)
        return web.Response(status=400, text=f"{error}\n")
    injection = admit(review, request.app[SETTINGS])
    _log(review, injection)
    return web.json_response(response(review.uid, injection))


async def healthz(_: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


def _log(review: Review, injection: Injection) -> None:
    """The warnings of pods made by controllers reach nobody but the controller: log them."""
    metadata: JSON = review.object.get("metadata") if isinstance(review.object, dict) else None
    if not isinstance(metadata, dict):
        metadata = {}
    pod = f"{review.namespace}/{metadata.get('name') or metadata.get('generateName')}"
    if injection.patch:
        log.info("sidecar injected into pod %.*s", _SHOWN, pod)
    for warning in injection.warnings:
        log.warning("pod %.*s: %s", _SHOWN, pod, warning)


def run(settings: WebhookSettings) -> None:
    """Serve until SIGTERM or SIGINT; :class:`ConfigError` if the certificate cannot load."""
    certificate = ServingCertificate(settings.cert_file, settings.key_file)
    log.info(
        "kuikproxy inject-webhook listening on %s:%d (sidecar image %s)",
        settings.host or "*",
        settings.port,
        settings.sidecar.image,
    )
    web.run_app(
        build_app(settings.sidecar, certificate),
        host=settings.host or None,
        port=settings.port,
        ssl_context=certificate.context,
        print=None,
        access_log=None,
    )
