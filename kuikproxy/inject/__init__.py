"""Sidecar injection (SPEC §13): ``kuikproxy inject-webhook``, a Kubernetes mutating admission
webhook that puts kuikproxy beside the containers of pods labelled ``kuikproxy.io/inject:
"true"`` and points their ``HTTPS_PROXY`` at it.

Pure core, thin edge: :mod:`.patch` computes the RFC 6902 patch from a pod and the sidecar
settings, :mod:`.review` reads and answers the ``AdmissionReview`` envelope, and
:mod:`.server` is the aiohttp edge (TLS, ``POST /mutate``, ``GET /healthz``).
"""
