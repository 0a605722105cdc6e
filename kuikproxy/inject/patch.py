"""The sidecar patch: from a pod (the JSON object an ``AdmissionReview`` carries) and the
sidecar settings, the RFC 6902 operations that put kuikproxy beside the pod's containers.

Pure: no I/O, no clock. Every decision the webhook makes about a pod is here; the edge only
reads the envelope (:mod:`.review`) and sends the answer (:mod:`.server`).

What a labelled pod (``kuikproxy.io/inject: "true"``) gets:

* the container ``kuikproxy``: ``serve --config /etc/kuikproxy/config.yaml`` on the loopback
  listener ``127.0.0.1:7439`` (the ConfigMap's ``listen``), exec probes (the kubelet sends
  ``httpGet`` and ``tcpSocket`` probes to the pod IP, which a loopback listener never
  answers), resources from the ``kuikproxy.io/cpu`` and ``kuikproxy.io/memory`` annotations or
  the defaults, a locked-down security context, and emptyDirs for ``/tmp`` and its state;
* in every other container of ``spec.containers``: ``HTTPS_PROXY`` and ``HTTP_PROXY`` pointing
  at the sidecar, a ``NO_PROXY`` that keeps the Kubernetes API and cluster names away from it,
  ``SSL_CERT_FILE`` naming the CA bundle, and the bundle mounted read-only. A variable the
  container already sets is left as it is, with a warning when it differs. Init containers
  are left alone: they run before the sidecar starts, so a proxy would be a port nobody
  listens on yet;
* the volumes: the config ConfigMap, the CA Secret (whole, for the sidecar, which needs the
  CA's key to mint certificates) and the same Secret's ``bundle.pem`` only (for the others,
  which must trust the CA and never hold its key).

A pod that already has a container named ``kuikproxy`` is left unchanged, so injecting twice
is a no-op. All or nothing: a pod that cannot take the whole patch (a name or a mount path
already taken, a malformed spec, ``hostNetwork``) gets none, and a warning says why. The
webhook never refuses a pod: whether a pod is admitted when the webhook cannot be called is
the ``MutatingWebhookConfiguration``'s ``failurePolicy``.

What the patch cannot see or do: the ConfigMap and the Secret are looked up in the pod's own
namespace, so they must exist in every namespace with injected pods; variables a container
gets through ``envFrom`` are invisible here, and the ones the patch adds take precedence over
them; the sidecar is an ordinary container, not a native sidecar (an init container with
``restartPolicy: Always``), because an API server without the SidecarContainers feature
(before 1.29) drops that field and the pod would never finish initialising; so the pod of a
Job would never complete, and Jobs are not for labelling.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuikproxy.errors import ConfigError

__all__ = ["INJECT_LABEL", "SIDECAR", "Injection", "SidecarSettings", "plan"]

INJECT_LABEL = "kuikproxy.io/inject"
CPU_ANNOTATION = "kuikproxy.io/cpu"
MEMORY_ANNOTATION = "kuikproxy.io/memory"

SIDECAR = "kuikproxy"
"""The sidecar's container name, and the mark of a pod already injected."""
PORT = 7439
PROXY_URL = f"http://127.0.0.1:{PORT}"
CONFIG_DIR = "/etc/kuikproxy"
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
CA_DIR = f"{CONFIG_DIR}/ca"
CA_BUNDLE_KEY = "bundle.pem"
CA_BUNDLE_FILE = f"{CA_DIR}/{CA_BUNDLE_KEY}"
STATE_DIR = "/var/lib/kuikproxy"
USER = 65532
"""The sidecar's user and group: distroless's ``nonroot``, no name needed in the image."""

NO_PROXY = ",".join(
    (
        "127.0.0.1",
        "localhost",
        "kubernetes.default.svc",
        ".svc",
        ".cluster.local",
        # in-cluster clients reach the API server at this address, known only on the node: the
        # kubelet expands the reference from the environment it gives every container
        "$(KUBERNETES_SERVICE_HOST)",
    )
)

VOLUME_CONFIG = "kuikproxy-config"
VOLUME_CA = "kuikproxy-ca"
VOLUME_CA_BUNDLE = "kuikproxy-ca-bundle"
VOLUME_TMP = "kuikproxy-tmp"
VOLUME_STATE = "kuikproxy-state"
VOLUMES = (VOLUME_CONFIG, VOLUME_CA, VOLUME_CA_BUNDLE, VOLUME_TMP, VOLUME_STATE)

# /healthz over loopback from inside the sidecar, ignoring any proxy variable of the image
PROBE = (
    "python3",
    "-c",
    "import urllib.request as u; "
    f"u.build_opener(u.ProxyHandler({{}})).open('http://127.0.0.1:{PORT}/healthz', timeout=3)",
)

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?")
_SHOWN = 63  # a DNS label's length: enough of a name, never a pod-sized warning

JSON = Any
"""A value decoded from JSON: the pod is read as the API server sent it, not trusted."""


@dataclass(frozen=True, slots=True)
class SidecarSettings:
    """What every injected sidecar shares (``kuikproxy inject-webhook``'s flags)."""

    image: str
    """The kuikproxy image: its entrypoint is ``kuikproxy``, and it has ``python3`` (probes)."""
    config_map: str
    """The ConfigMap with ``config.yaml`` (``listen: 127.0.0.1:7439``), at /etc/kuikproxy."""
    ca_bundle_secret: str
    """The Secret with ``bundle.pem`` (system roots and kuikproxy's CA: the other containers'
    ``SSL_CERT_FILE``) and the CA certificate and key the config's ``forwardProxy.ca`` names
    under /etc/kuikproxy/ca/ (the sidecar's alone)."""
    cpu: str = "50m"
    """The sidecar's CPU request when the pod has no ``kuikproxy.io/cpu``."""
    memory: str = "384Mi"
    """The sidecar's memory request and limit when the pod has no ``kuikproxy.io/memory``:
    room for the default ``cache.maxBytes`` (256Mi) and the process (about 80Mi). A config
    with a smaller cache can do with a smaller annotation."""

    def __post_init__(self) -> None:
        errors = []
        if not self.image or any(character.isspace() for character in self.image):
            errors.append(f"sidecar image: not an image reference: {self.image!r}")
        for what, name in (
            ("config map", self.config_map),
            ("CA bundle secret", self.ca_bundle_secret),
        ):
            if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
                errors.append(f"{what}: not a Kubernetes object name: {name!r}")
        for what, quantity in (("default cpu", self.cpu), ("default memory", self.memory)):
            if not _positive_quantity(quantity):
                errors.append(f"{what}: not a positive quantity: {quantity!r}")
        if errors:
            raise ConfigError(errors)


@dataclass(frozen=True, slots=True)
class Injection:
    """What the webhook answers for one pod: the patch (empty: leave the pod as it is) and
    warnings for whoever created the pod (and the webhook's log)."""

    patch: tuple[dict[str, JSON], ...] = ()
    warnings: tuple[str, ...] = ()


class _Unpatchable(Exception):
    """The pod cannot take the whole patch; the message says why, for a warning."""


def plan(pod: JSON, settings: SidecarSettings) -> Injection:
    """The patch that injects the sidecar into ``pod``, or none: not labelled, already
    injected, or unpatchable (then with a warning)."""
    if not _labelled(pod):
        return Injection()
    try:
        return _plan(pod, settings)
    except _Unpatchable as reason:
        return Injection(warnings=(f"kuikproxy: sidecar not injected: {reason}",))


def _labelled(pod: JSON) -> bool:
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return isinstance(labels, dict) and labels.get(INJECT_LABEL) == "true"


def _plan(pod: dict[str, JSON], settings: SidecarSettings) -> Injection:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise _Unpatchable("the pod has no spec")
    containers = _objects(spec, "containers", "spec")
    if not containers:
        raise _Unpatchable("the pod has no containers")
    names = [_name(container) for container in containers]
    if SIDECAR in names:
        return Injection()
    if SIDECAR in (_name(init) for init in _objects(spec, "initContainers", "spec")):
        raise _Unpatchable(f"an init container is already named {SIDECAR}")
    if spec.get("hostNetwork") is True:
        raise _Unpatchable("the pod uses the node's network, where loopback is the node's")
    volumes = _objects(spec, "volumes", "spec")
    existing = {_name(volume) for volume in volumes}
    taken = [name for name in VOLUMES if name in existing]
    if taken:
        raise _Unpatchable(f"volume {_shown(taken[0])} already exists")

    patch: list[dict[str, JSON]] = []
    warnings: list[str] = []
    for index, (container, name) in enumerate(zip(containers, names, strict=True)):
        where = f"container {_shown(name)}"
        mounts = _objects(container, "volumeMounts", where)
        if any(_mount_path(mount) == CA_DIR for mount in mounts):
            raise _Unpatchable(f"{where} already mounts something at {CA_DIR}")
        env, env_warnings = _env(container, where)
        warnings += env_warnings
        patch += _append(("spec", "containers", index, "env"), container.get("env"), env)
        bundle = {"name": VOLUME_CA_BUNDLE, "mountPath": CA_DIR, "readOnly": True}
        patch += _append(
            ("spec", "containers", index, "volumeMounts"), container.get("volumeMounts"), [bundle]
        )
    annotations = pod["metadata"].get("annotations")  # a dict: the label was read from it
    resources, resource_warnings = _resources(
        annotations if isinstance(annotations, dict) else {}, settings
    )
    warnings += resource_warnings
    patch += _append(("spec", "volumes"), spec.get("volumes"), _volumes(settings))
    patch += _append(("spec", "containers"), containers, [_sidecar(settings, resources)])
    return Injection(tuple(patch), tuple(warnings))


def _objects(parent: dict[str, JSON], key: str, where: str) -> list[dict[str, JSON]]:
    """``parent[key]`` as a list of objects (absent or null: empty)."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _Unpatchable(f"{where}.{key} is not a list of objects")
    return value


def _name(item: dict[str, JSON]) -> str | None:
    name = item.get("name")
    return name if isinstance(name, str) else None


def _mount_path(mount: dict[str, JSON]) -> str | None:
    path = mount.get("mountPath")
    return posixpath.normpath(path) if isinstance(path, str) and path else None


def _shown(value: str | None) -> str:
    """A name from the pod, quoted and cut short: the pod is not validated yet."""
    text = "" if value is None else value
    return f'"{text[:_SHOWN]}…"' if len(text) > _SHOWN else f'"{text}"'


def _env(container: dict[str, JSON], where: str) -> tuple[list[dict[str, str]], list[str]]:
    """The variables to append to a container, and warnings for those it sets itself.

    Go (``net/http``'s ``ProxyFromEnvironment``) reads ``HTTPS_PROXY`` and then
    ``https_proxy``, likewise for ``HTTP_PROXY`` and ``NO_PROXY``, so either spelling counts
    as set: an upper-case variable added beside a lower-case one would silently override it.
    A lower-case ``no_proxy`` alone is kept in the new ``NO_PROXY`` through ``$(no_proxy)``,
    which the kubelet expands since it comes earlier in the list (kube-image-keeper's chart
    puts its own registry there).
    """
    declared = {
        name: variable
        for variable in _objects(container, "env", where)
        if (name := _name(variable)) is not None
    }
    added: list[dict[str, str]] = []
    warnings: list[str] = []

    def keep_or_add(spellings: tuple[str, ...], value: str, consequence: str) -> None:
        present = next((declared[name] for name in spellings if name in declared), None)
        if present is None:
            added.append({"name": spellings[0], "value": value})
        elif present.get("value") != value:
            warnings.append(
                f"kuikproxy: {where} sets {present['name']} itself, left as it is: {consequence}"
            )

    bypass = "its requests may not go through kuikproxy"
    keep_or_add(("HTTPS_PROXY", "https_proxy"), PROXY_URL, bypass)
    keep_or_add(("HTTP_PROXY", "http_proxy"), PROXY_URL, bypass)
    if "NO_PROXY" not in declared and "no_proxy" in declared:
        added.append({"name": "NO_PROXY", "value": f"{NO_PROXY},$(no_proxy)"})
    else:
        keep_or_add(("NO_PROXY",), NO_PROXY, "it must keep the Kubernetes API out of the proxy")
    keep_or_add(("SSL_CERT_FILE",), CA_BUNDLE_FILE, "it may not trust kuikproxy's CA")
    return added, warnings


def _append(
    path: tuple[str | int, ...], current: JSON, items: list[dict[str, JSON]]
) -> list[dict[str, JSON]]:
    """Operations appending ``items`` to the array at ``path``: one ``add`` of the whole array
    where there is none yet (RFC 6902 cannot append to a missing array), else one per item."""
    if not items:
        return []
    if current is None:
        return [{"op": "add", "path": json_pointer(path), "value": items}]
    return [{"op": "add", "path": json_pointer((*path, "-")), "value": item} for item in items]


def json_pointer(tokens: tuple[str | int, ...]) -> str:
    """An RFC 6901 pointer: ``~`` and ``/`` in a token escaped, in that order."""
    return "".join("/" + str(token).replace("~", "~0").replace("/", "~1") for token in tokens)


def _positive_quantity(value: JSON) -> bool:
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    return match is not None and float(match["number"]) > 0


def _resources(
    annotations: Mapping[str, JSON], settings: SidecarSettings
) -> tuple[dict[str, JSON], list[str]]:
    """Requests and limits: memory's request is its limit (memory cannot be taken back, so a
    pod is never killed for using what it asked for); CPU has a request only (a limit would
    only throttle the proxy while the containers it serves wait)."""
    warnings = []
    chosen = {}
    for resource, annotation, default in (
        ("cpu", CPU_ANNOTATION, settings.cpu),
        ("memory", MEMORY_ANNOTATION, settings.memory),
    ):
        value = annotations.get(annotation, default)
        if not _positive_quantity(value):
            warnings.append(
                f"kuikproxy: annotation {annotation}: {_shown(str(value))} is not a positive "
                f"quantity, {default} used instead"
            )
            value = default
        chosen[resource] = value
    resources = {"requests": chosen, "limits": {"memory": chosen["memory"]}}
    return resources, warnings


def _volumes(settings: SidecarSettings) -> list[dict[str, JSON]]:
    return [
        {"name": VOLUME_CONFIG, "configMap": {"name": settings.config_map}},
        # The whole Secret, the CA's key included, mounted in the sidecar only. Its files are
        # root's and the sidecar runs as 65532 without a pod fsGroup, so the default mode
        # (0644) stays: a tighter one would lock kuikproxy out of its own key.
        {"name": VOLUME_CA, "secret": {"secretName": settings.ca_bundle_secret}},
        {
            "name": VOLUME_CA_BUNDLE,
            "secret": {
                "secretName": settings.ca_bundle_secret,
                "items": [{"key": CA_BUNDLE_KEY, "path": CA_BUNDLE_KEY}],
            },
        },
        {"name": VOLUME_TMP, "emptyDir": {}},
        # survives a restart of the sidecar (P13 with state.path under /var/lib/kuikproxy),
        # not of the pod
        {"name": VOLUME_STATE, "emptyDir": {}},
    ]


def _sidecar(settings: SidecarSettings, resources: dict[str, JSON]) -> dict[str, JSON]:
    probe = {"exec": {"command": list(PROBE)}, "timeoutSeconds": 5, "failureThreshold": 3}
    return {
        "name": SIDECAR,
        "image": settings.image,
        "args": ["serve", "--config", CONFIG_FILE],
        "resources": resources,
        "readinessProbe": {**probe, "periodSeconds": 10},
        # a minute without an answer: an event loop that stuck, not a busy one
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 20},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER,
            "runAsGroup": USER,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # an invalid config stops kuikproxy at start; its last words then show in the pod's
        # status (kubectl describe) without a trip to the logs
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": VOLUME_CONFIG, "mountPath": CONFIG_DIR, "readOnly": True},
            # inside the ConfigMap's mount: the kubelet makes the mount point in it
            {"name": VOLUME_CA, "mountPath": CA_DIR, "readOnly": True},
            {"name": VOLUME_TMP, "mountPath": "/tmp"},
            {"name": VOLUME_STATE, "mountPath": STATE_DIR},
        ],
    }
