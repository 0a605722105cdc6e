"""The chart lints clean and renders, in both modes, with default and with fully-set values, into
objects that Kubernetes 1.30 accepts (kubernetes-validate, strict: no unknown field anywhere)
and that fit together (selectors, ports, volumes, names)."""

from __future__ import annotations

import hashlib
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from kuikproxy.config import parse_config
from tests.chart import (
    KUBE_VERSION,
    NAMESPACE,
    Rendered,
    crs,
    full_values,
    lint,
    pod_specs,
    render,
    with_mode,
)

MODES = ("service", "injector")

# Each case: values an install might use. "default" and "full" are the acceptance's two; the
# others reach the branches full values leave out (a chart-made claim and issuer, a NodePort
# without a fixed port, the chart's own CA and webhook certificate).
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "full": full_values(),
    "persistence": {
        "persistence": {"enabled": True},
        "service": {"type": "NodePort"},
        "podDisruptionBudget": {"minAvailable": "50%"},
    },
    "cert-manager": {
        "webhook": {"certManager": {"enabled": True}},
        "serviceMonitor": {"create": True},
    },
    "monitoring": {
        "serviceMonitor": {"create": True},
        "prometheusRule": {"create": True},
        "grafanaDashboard": {"create": True, "datasourceUid": ""},
        "serviceAccount": {"create": False},
        "podDisruptionBudget": {"create": False},
    },
}

KNOWN_ELSEWHERE = {kind for _, kind in crs.SCHEMAS}
"""Custom resources: kubernetes-validate has no schema for them; tests/chart/crs.py has."""


def values_for(case: str, mode: str) -> dict[str, Any]:
    return with_mode(CASES[case], mode)


@pytest.fixture(scope="module", params=[(c, m) for c in CASES for m in MODES], ids="-".join)
def rendered(request: pytest.FixtureRequest) -> Rendered:
    case, mode = request.param
    return render(values_for(case, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["default", "full"])
def test_lints_clean(case: str, mode: str) -> None:
    report = lint(values_for(case, mode))
    assert report["errors"] == []
    # Severity 1 is INFO ("icon is recommended": the project has no icon); 2 is a warning.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_object_validates(rendered: Rendered) -> None:
    """Every object of a kind Kubernetes 1.30 knows validates against its schema with strict
    semantics (no unknown field), and every other one is a custom resource with a schema of
    its own (tests/chart/crs.py)."""
    for manifest in rendered:
        try:
            kubernetes_validate.validate(manifest.doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert manifest.kind in KNOWN_ELSEWHERE, f"{manifest.template}: {manifest.kind}"
            crs.validate(manifest.doc)


def test_objects_are_labelled_and_unique(rendered: Rendered) -> None:
    seen = set()
    for manifest in rendered:
        labels = manifest.doc["metadata"]["labels"]
        for label in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/component",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ):
            assert labels.get(label), f"{manifest.template}: {manifest.kind} without {label}"
        key = (manifest.kind, manifest.namespace, manifest.name)
        assert key not in seen, key
        seen.add(key)


@pytest.mark.parametrize("case", list(CASES))
def test_service_mode(case: str) -> None:
    values = values_for(case, "service")
    objects = render(values)
    assert objects.kinds() & {"MutatingWebhookConfiguration", "Issuer", "Certificate"} == set()
    (deployment,) = objects.of("Deployment")
    (service,) = objects.of("Service")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    # One process paces: never two replicas, not even during a rollout.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert container["command"] == ["kuikproxy"]
    assert container["args"][:3] == ["serve", "--config", "/etc/kuikproxy/config.yaml"]
    assert container["ports"] == [{"name": "http", "containerPort": 7439, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # The Service reaches the pod, on the port kuikproxy listens on.
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    config = parse_config(
        objects.one("ConfigMap", f"{deployment['metadata']['name']}-config")["data"]["config.yaml"]
    )
    assert config.listen == "0.0.0.0:7439"
    # state.path lives on the state volume.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert config.state.path is not None
    assert config.state.path.startswith(mounts["state"] + "/")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    if values.get("persistence", {}).get("enabled"):
        claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
        existing = values["persistence"].get("existingClaim")
        if existing:
            assert claim == existing
            assert objects.of("PersistentVolumeClaim") == []
        else:
            assert objects.one("PersistentVolumeClaim", claim)
    else:
        assert volumes["state"] == {"name": "state", "emptyDir": {}}
    # the pull-through store lives on a volume of its own (§15)
    assert config.cache.blobs.path is not None
    assert config.cache.blobs.path.startswith(mounts["store"] + "/")
    claim = values.get("store", {}).get("existingClaim")
    if claim:
        assert volumes["store"] == {"name": "store", "persistentVolumeClaim": {"claimName": claim}}
    else:
        assert volumes["store"] == {"name": "store", "emptyDir": {"sizeLimit": "11Gi"}}


def test_the_store_can_be_turned_off_or_placed_by_config() -> None:
    """``store.enabled: false``: no store volume, no ``cache.blobs.path`` (blobs stream
    through); a ``cache.blobs.path`` in ``config`` is kept; mode injector keeps no store."""

    def rendered(values: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        objects = render(values)
        config = parse_config(objects.of("ConfigMap")[0]["data"]["config.yaml"])
        specs = [spec for _, spec in pod_specs(objects)]
        return config, {v["name"]: v for spec in specs for v in spec["volumes"]}

    config, volumes = rendered({"store": {"enabled": False}})
    assert config.cache.blobs.path is None and "store" not in volumes
    config, volumes = rendered({"store": {"sizeLimit": ""}})
    assert volumes["store"] == {"name": "store", "emptyDir": {}}
    config, volumes = rendered({"config": {"cache": {"blobs": {"path": "/var/cache/kuikproxy/x"}}}})
    assert config.cache.blobs.path == "/var/cache/kuikproxy/x" and "store" in volumes
    config, volumes = rendered({"mode": "injector"})
    assert config.cache.blobs.path is None and "store" not in volumes


def test_full_values_reach_the_objects() -> None:
    values = full_values()
    objects = render(with_mode(values, "service"))
    (deployment,) = objects.of("Deployment")
    (service,) = objects.of("Service")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert deployment["metadata"]["name"] == "kuikproxy-full"
    assert container["image"] == "registry.example:5000/platform/kuikproxy:0.1.0-rc.1"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"][3:] == ["--log-level", "debug", "--log-format", "text"]
    assert container["env"] == values["env"]
    assert container["resources"] == values["resources"]
    assert pod["spec"]["imagePullSecrets"] == values["imagePullSecrets"]
    assert pod["spec"]["serviceAccountName"] == "kuikproxy-sa"
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
        assert pod["spec"][key] == values[key]
    assert pod["metadata"]["annotations"] == values["podAnnotations"]  # rollOnConfigChange off
    assert values["extraVolumes"][0] in pod["spec"]["volumes"]
    assert values["extraVolumeMounts"][0] in container["volumeMounts"]
    assert pod["metadata"]["labels"]["example.com/tier"] == "infra"
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["clusterIP"] == "10.96.0.74"
    assert service["spec"]["ports"][0] == {
        "name": "http",
        "port": 5000,
        "targetPort": "http",
        "protocol": "TCP",
        "nodePort": 30439,
    }
    assert objects.one("ServiceAccount", "kuikproxy-sa")["metadata"]["annotations"] == {
        "example.com/owner": "platform"
    }
    assert objects.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert "maxUnavailable" not in objects.one("PodDisruptionBudget")["spec"]
    # The config is the values' config, with the keys the chart owns, and numbers kept as such.
    text = objects.one("ConfigMap", "kuikproxy-full-config")["data"]["config.yaml"]
    assert "268435456" in text
    config = parse_config(text)
    assert config.cache.max_bytes == 268435456
    assert config.state.path == "/var/lib/kuikproxy/pacing.db"
    assert config.registries["docker.io"].check.interval == 60
    assert not config.registries["registry.internal:5000"].paced


def test_security_contexts(rendered: Rendered) -> None:
    for name, spec in pod_specs(rendered):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 65532, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["runAsUser"] == 65532
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            # The only writable places are volumes: /tmp, and the state directory.
            writable = {
                m["mountPath"]: volumes[m["name"]]
                for m in container["volumeMounts"]
                if not m.get("readOnly")
            }
            assert "emptyDir" in writable.pop("/tmp")
            assert set(writable) <= {"/var/lib/kuikproxy", "/var/cache/kuikproxy"}, writable


def test_volumes_name_what_the_release_makes(rendered: Rendered) -> None:
    """Every ConfigMap, Secret and claim a pod mounts is one the release creates, or one the
    values name as existing (or cert-manager's Secret)."""
    made = {(m.kind, m.namespace, m.name) for m in rendered}
    external = {"kuikproxy-state", "kuikproxy-blobs", "dockerhub-token"}  # values-full.yaml's
    for certificate in rendered.of("Certificate"):
        external.add(certificate["spec"]["secretName"])
    for _, spec in pod_specs(rendered):
        for volume in spec["volumes"]:
            if "configMap" in volume:
                assert ("ConfigMap", NAMESPACE, volume["configMap"]["name"]) in made
            elif "secret" in volume:
                name = volume["secret"]["secretName"]
                assert ("Secret", NAMESPACE, name) in made or name in external
            elif "persistentVolumeClaim" in volume:
                name = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", NAMESPACE, name) in made or name in external
            else:
                assert volume.keys() == {"name", "emptyDir"}


def test_pdb_and_service_monitor_select_the_workload(rendered: Rendered) -> None:
    (deployment,) = rendered.of("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for pdb in rendered.of("PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for monitor in rendered.of("ServiceMonitor"):
        (service,) = [
            s
            for s in rendered.of("Service")
            if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports
            assert endpoint["path"] == "/metrics"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


@pytest.mark.parametrize("mode", MODES)
def test_checksum_follows_the_config(mode: str) -> None:
    def checksum(config: dict[str, Any] | None = None) -> str:
        values: dict[str, Any] = {"mode": mode}
        if config is not None:
            values["config"] = config
        (deployment,) = render(values).of("Deployment")
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/config"])

    slower = {"registries": {"default": {"check": {"interval": "2m"}}}}
    assert checksum() == checksum()
    assert checksum() != checksum(slower)
    assert checksum(slower) == checksum(slower)
    # It is the digest of the config file the pods read.
    objects = render({"mode": mode, "config": slower})
    text = objects.of("ConfigMap")[0]["data"]["config.yaml"]
    assert checksum(slower) == hashlib.sha256(text.rstrip("\n").encode()).hexdigest()


def test_listen_is_the_charts() -> None:
    """A config copied from examples/config.yaml keeps its loopback `listen`; the chart's wins,
    or the Service (mode service) or the webhook's HTTPS_PROXY (mode injector) would miss it."""
    for mode, listen in (("service", "0.0.0.0:7439"), ("injector", "127.0.0.1:7439")):
        objects = render({"mode": mode, "config": {"listen": "127.0.0.1:9999"}})
        assert parse_config(objects.of("ConfigMap")[0]["data"]["config.yaml"]).listen == listen


def test_no_checksum_when_reloading_in_place() -> None:
    (deployment,) = render({"rollOnConfigChange": False}).of("Deployment")
    assert "annotations" not in deployment["spec"]["template"]["metadata"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "sidecar"}, 'mode must be "service" or "injector", not "sidecar"'),
        ({"config": ["not", "a", "mapping"]}, "config must be a mapping"),
        ({"mode": "injector", "webhook": {"failurePolicy": "Open"}}, "failurePolicy must be"),
    ],
)
def test_refuses_values_that_cannot_work(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)
