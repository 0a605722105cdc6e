"""Forward-proxy mode (SPEC §13): kuikproxy as the ``HTTPS_PROXY`` of registry clients.

:mod:`.front` takes each new connection first: a ``CONNECT`` is intercepted with a leaf
certificate from :mod:`.authority` (or tunnelled blind, for ``forwardProxy.tunnelHosts``, or
refused), and whatever comes out of it — like any other request — is handed to the aiohttp
application, which classifies, paces and relays it exactly as a mirror request.
"""
