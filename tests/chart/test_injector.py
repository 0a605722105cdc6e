"""mode injector: the webhook Deployment and Service, the MutatingWebhookConfiguration, its
certificate (made by the chart, or by cert-manager), and what each injected namespace gets (the
sidecar's config and CA)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from kuikproxy.config import parse_config
from kuikproxy.forward.authority import Authority
from kuikproxy.inject import patch
from tests import certs
from tests.chart import NAMESPACE, RELEASE, Rendered, full_values, render, with_mode

FULLNAME = f"{RELEASE}-kuikproxy"
SERVICE = f"{FULLNAME}-injector"


def injector(values: dict[str, Any] | None = None) -> Rendered:
    return render({**(values or {}), "mode": "injector"})


def cert(data: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(data))


def test_webhook_deployment_and_service() -> None:
    objects = injector()
    assert objects.kinds() == {
        "ServiceAccount",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "MutatingWebhookConfiguration",
        "PodDisruptionBudget",
    }
    deployment = objects.one("Deployment", SERVICE)
    service = objects.one("Service", SERVICE)
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert container["command"] == ["kuikproxy"]
    # The flags kuikproxy inject-webhook takes (kuikproxy/cli.py).
    assert container["args"] == [
        "inject-webhook",
        "--listen",
        "0.0.0.0:8443",
        "--tls-cert-file",
        "/tls/tls.crt",
        "--tls-key-file",
        "/tls/tls.key",
        "--sidecar-image",
        "ghcr.io/kuikproxy/kuikproxy:0.1.0",
        "--config-map",
        f"{FULLNAME}-config",
        "--ca-bundle-secret",
        f"{FULLNAME}-ca",
        "--log-level",
        "info",
        "--log-format",
        "json",
    ]
    assert "env" not in container
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/tls"]]["secret"]["secretName"] == f"{FULLNAME}-webhook-tls"
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_mutating_webhook_configuration() -> None:
    objects = injector()
    (configuration,) = objects.of("MutatingWebhookConfiguration")
    assert "namespace" not in configuration["metadata"]  # cluster-scoped
    (webhook,) = configuration["webhooks"]
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "None"
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["timeoutSeconds"] == 10
    assert webhook["objectSelector"] == {"matchLabels": {"kuikproxy.io/inject": "true"}}
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE]}
        ]
    }
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["clientConfig"]["service"] == {
        "name": SERVICE,
        "namespace": NAMESPACE,
        "path": "/mutate",
        "port": 443,
    }
    full = with_mode(full_values(), "injector")
    (webhook,) = render(full).one("MutatingWebhookConfiguration")["webhooks"]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["reinvocationPolicy"] == "Never"
    assert webhook["timeoutSeconds"] == 5
    assert webhook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kuik-system", "build"]


def test_generated_certificate() -> None:
    """Without cert-manager, the chart makes a CA and a serving certificate: the Secret the
    webhook mounts holds them, the caBundle is that CA, the certificate is the CA's and names
    the webhook Service, and the pod's checksum is of this very certificate (made once per
    render, though three templates use it)."""
    objects = injector()
    secret = objects.one("Secret", f"{FULLNAME}-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = secret["data"]
    (webhook,) = objects.one("MutatingWebhookConfiguration")["webhooks"]
    assert webhook["clientConfig"]["caBundle"] == data["ca.crt"]
    ca, leaf = cert(data["ca.crt"]), cert(data["tls.crt"])
    assert leaf.issuer == ca.subject
    public_key = ca.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    assert leaf.signature_hash_algorithm is not None
    public_key.verify(
        leaf.signature,
        leaf.tbs_certificate_bytes,
        padding.PKCS1v15(),
        leaf.signature_hash_algorithm,
    )
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{SERVICE}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    deployment = objects.one("Deployment", SERVICE)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    remembered = json.dumps(
        {"ca": data["ca.crt"], "crt": data["tls.crt"], "key": data["tls.key"]},
        separators=(",", ":"),
    )
    assert annotations["checksum/tls"] == hashlib.sha256(remembered.encode()).hexdigest()


def test_cert_manager_certificate() -> None:
    objects = injector({"webhook": {"certManager": {"enabled": True}}})
    assert f"{FULLNAME}-webhook-tls" not in {s["metadata"]["name"] for s in objects.of("Secret")}
    issuer = objects.one("Issuer")
    certificate = objects.one("Certificate", f"{FULLNAME}-webhook")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
    }
    assert certificate["spec"]["secretName"] == f"{FULLNAME}-webhook-tls"
    assert f"{SERVICE}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    configuration = objects.one("MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{FULLNAME}-webhook"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    deployment = objects.one("Deployment", SERVICE)
    assert "checksum/tls" not in deployment["spec"]["template"]["metadata"]["annotations"]

    full = render(with_mode(full_values(), "injector"))
    assert full.of("Issuer") == []
    assert full.one("Certificate")["spec"]["issuerRef"] == {
        "name": "platform-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def flag(container: dict[str, Any], name: str) -> str:
    args: list[str] = container["args"]
    return args[args.index(name) + 1]


def test_each_injected_namespace_gets_the_sidecar_config_and_ca(tmp_path: Path) -> None:
    """What the webhook's sidecar mounts (kuikproxy/inject/patch.py: the ConfigMap at
    /etc/kuikproxy, the CA Secret at /etc/kuikproxy/ca, the state at /var/lib/kuikproxy) is
    there, in every injected namespace, and is what kuikproxy needs: a config it accepts,
    listening where HTTPS_PROXY points, and a CA it can mint certificates from."""
    namespaces = ["kuik-system", "build"]
    extra = cert_pem()
    objects = injector({"injector": {"namespaces": namespaces, "ca": {"extraCertificates": extra}}})
    (container,) = objects.one("Deployment", SERVICE)["spec"]["template"]["spec"]["containers"]
    configmaps = {str(m.namespace): m.doc for m in objects if m.kind == "ConfigMap"}
    secrets = {
        str(m.namespace): m.doc
        for m in objects
        if m.kind == "Secret" and m.name == flag(container, "--ca-bundle-secret")
    }
    assert sorted(configmaps) == sorted(secrets) == sorted(namespaces)
    for namespace in namespaces:
        configmap = configmaps[namespace]
        assert configmap["metadata"]["name"] == flag(container, "--config-map")
        config = parse_config(configmap["data"]["config.yaml"])
        assert config.listen == f"127.0.0.1:{patch.PORT}"
        assert config.forward_proxy.enabled
        assert config.forward_proxy.ca.cert_file == f"{patch.CA_DIR}/tls.crt"
        assert config.forward_proxy.ca.key_file == f"{patch.CA_DIR}/tls.key"
        assert config.state.path == f"{patch.STATE_DIR}/state.db"
        data = {key: base64.b64decode(value) for key, value in secrets[namespace]["data"].items()}
        assert data["ca.crt"] == data["tls.crt"]
        ca = x509.load_pem_x509_certificate(data["tls.crt"])
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        # The other containers' SSL_CERT_FILE: the CA, then the extra certificates.
        bundle = x509.load_pem_x509_certificates(data[patch.CA_BUNDLE_KEY])
        assert bundle == [ca, x509.load_pem_x509_certificate(extra.encode())]
        # kuikproxy's forward proxy takes the CA and mints a certificate for a registry from it.
        (tmp_path / namespace).mkdir()
        cert_file, key_file = tmp_path / namespace / "tls.crt", tmp_path / namespace / "tls.key"
        cert_file.write_bytes(data["tls.crt"])
        key_file.write_bytes(data["tls.key"])
        authority = Authority(str(cert_file), str(key_file))
        try:
            assert isinstance(authority.context("registry-1.docker.io"), ssl.SSLContext)
        finally:
            authority.close()
    # One CA per namespace: a key read in one namespace intercepts no other.
    assert secrets["kuik-system"]["data"]["tls.key"] != secrets["build"]["data"]["tls.key"]


def cert_pem() -> str:
    """A self-signed certificate, PEM: what --set-file would append to the bundle."""
    root = certs.certificate("extra root", certs.new_key(), ca=True, before=dt.timedelta(0))
    return certs.cert_pem(root).decode()


def test_sidecar_settings_passed_to_the_webhook() -> None:
    values = with_mode(full_values(), "injector")
    objects = render(values)
    deployment = objects.one("Deployment", "kuikproxy-full-injector")
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][7:] == [
        "--sidecar-image",
        "registry.example:5000/platform/kuikproxy:0.1.0-rc.1",
        "--config-map",
        "kuikproxy-full-config",
        "--ca-bundle-secret",
        "kuikproxy-sidecar-ca",
        "--log-level",
        "debug",
        "--log-format",
        "text",
    ]
    assert container["env"] == [{"name": "TZ", "value": "UTC"}]
    # An existing CA Secret is used as it is: the chart makes none.
    assert [s["metadata"]["name"] for s in objects.of("Secret")] == []
    # The sidecar config keeps the user's forward-proxy settings beside the chart's.
    config = parse_config(objects.of("ConfigMap")[0]["data"]["config.yaml"])
    assert config.forward_proxy.tunnel_hosts == ("*.internal.example",)
    assert config.listen == "127.0.0.1:7439"
    # Nothing to scrape: the webhook serves no /metrics, and sidecars listen on loopback.
    assert objects.of("ServiceMonitor") == []
