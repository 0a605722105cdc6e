"""The sidecar patch (:mod:`kuikproxy.inject.patch`), pod by pod, without a server."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kuikproxy.errors import ConfigError
from kuikproxy.inject.patch import NO_PROXY, Injection, SidecarSettings, json_pointer, plan
from kuikproxy.inject.review import Review, admit
from tests.inject.jsonpatch import apply
from tests.inject.pods import SETTINGS, kuik_review

POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}


def kuik_pod() -> dict[str, Any]:
    """The kube-image-keeper controllers pod, as the API server hands it to webhooks."""
    pod: dict[str, Any] = kuik_review()["request"]["object"]
    return pod


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A labelled pod with ``containers`` (default: one bare container) and more ``spec``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app", "labels": {"kuikproxy.io/inject": "true"}},
        "spec": {"containers": list(containers) or [{"name": "app", "image": "app:1"}], **spec},
    }


def injected(original: dict[str, Any]) -> tuple[dict[str, Any], Injection]:
    """``original`` patched, after checking it is a valid Kubernetes 1.30 Pod."""
    injection = plan(original, SETTINGS)
    patched: dict[str, Any] = apply(original, list(injection.patch))
    kubernetes_validate.validate(patched, "1.30", strict=True)
    return patched, injection


def env(container: dict[str, Any]) -> dict[str, str]:
    return {variable["name"]: variable.get("value") for variable in container.get("env", [])}


def test_a_bare_pod_gets_whole_arrays_where_it_has_none() -> None:
    """A container without env or volumeMounts, and a pod without volumes: RFC 6902 cannot
    append to an array that is not there, so each is added whole."""
    injection = plan(pod(), SETTINGS)
    paths = [operation["path"] for operation in injection.patch]
    assert paths == [
        "/spec/containers/0/env",
        "/spec/containers/0/volumeMounts",
        "/spec/volumes",
        "/spec/containers/-",
    ]
    patched, _ = injected(pod())
    app, sidecar = patched["spec"]["containers"]
    assert env(app) == {
        "HTTPS_PROXY": "http://127.0.0.1:7439",
        "HTTP_PROXY": "http://127.0.0.1:7439",
        "NO_PROXY": NO_PROXY,
        "SSL_CERT_FILE": "/etc/kuikproxy/ca/bundle.pem",
    }
    assert app["volumeMounts"] == [
        {"name": "kuikproxy-ca-bundle", "mountPath": "/etc/kuikproxy/ca", "readOnly": True}
    ]
    assert sidecar["name"] == "kuikproxy"
    assert injection.warnings == ()


def test_the_sidecar() -> None:
    """The sidecar: the image from the settings, `serve` on the mounted config, exec probes
    on loopback, default resources, locked down, writable only where it must be."""
    patched, _ = injected(pod())
    sidecar = patched["spec"]["containers"][-1]
    assert sidecar["image"] == "ghcr.io/example/kuikproxy:0.1.0"
    assert sidecar["args"] == ["serve", "--config", "/etc/kuikproxy/config.yaml"]
    assert "ports" not in sidecar  # loopback only: nothing to publish
    for probe in (sidecar["readinessProbe"], sidecar["livenessProbe"]):
        command = probe["exec"]["command"]
        assert command[:2] == ["python3", "-c"]
        assert "http://127.0.0.1:7439/healthz" in command[2]
    assert sidecar["resources"] == {
        "requests": {"cpu": "50m", "memory": "384Mi"},
        "limits": {"memory": "384Mi"},
    }
    assert sidecar["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts = {mount["mountPath"]: mount for mount in sidecar["volumeMounts"]}
    assert mounts["/etc/kuikproxy"]["readOnly"] and mounts["/etc/kuikproxy/ca"]["readOnly"]
    assert "readOnly" not in mounts["/tmp"] and "readOnly" not in mounts["/var/lib/kuikproxy"]
    volumes = {volume["name"]: volume for volume in patched["spec"]["volumes"]}
    assert volumes["kuikproxy-config"] == {
        "name": "kuikproxy-config",
        "configMap": {"name": "kuikproxy-sidecar"},
    }
    # the sidecar sees the whole Secret (the CA's key); the other containers the bundle only
    assert volumes["kuikproxy-ca"]["secret"] == {"secretName": "kuikproxy-ca"}
    assert volumes["kuikproxy-ca-bundle"]["secret"] == {
        "secretName": "kuikproxy-ca",
        "items": [{"key": "bundle.pem", "path": "bundle.pem"}],
    }
    assert volumes["kuikproxy-tmp"]["emptyDir"] == volumes["kuikproxy-state"]["emptyDir"] == {}


def test_the_existing_env_is_kept_and_only_missing_variables_are_appended() -> None:
    """Variables a container sets stay first and unchanged; ours are appended one by one."""
    variables = [
        {"name": "LOG_LEVEL", "value": "debug"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    original = pod({"name": "app", "image": "app:1", "env": copy.deepcopy(variables)})
    patched, injection = injected(original)
    container = patched["spec"]["containers"][0]
    assert container["env"][:2] == variables
    assert [variable["name"] for variable in container["env"][2:]] == [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "NO_PROXY",
        "SSL_CERT_FILE",
    ]
    assert [operation["path"] for operation in injection.patch[:4]] == [
        "/spec/containers/0/env/-"
    ] * 4


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "https_proxy"])
def test_a_proxy_the_container_sets_is_left_with_a_warning(name: str) -> None:
    """A container's own proxy, in either spelling Go reads, is left as it is (an upper-case
    HTTPS_PROXY added beside https_proxy would silently override it), with a warning."""
    original = pod({"name": "app", "image": "app:1", "env": [{"name": name, "value": "x:3128"}]})
    patched, injection = injected(original)
    names = [variable["name"] for variable in patched["spec"]["containers"][0]["env"]]
    assert names == [name, "HTTP_PROXY", "NO_PROXY", "SSL_CERT_FILE"]
    assert injection.warnings == (
        f'kuikproxy: container "app" sets {name} itself, left as it is: '
        "its requests may not go through kuikproxy",
    )


def test_variables_already_pointing_at_kuikproxy_need_no_warning() -> None:
    """A container configured by hand exactly as the webhook would gets nothing twice and no
    warning."""
    variables = [
        {"name": "HTTPS_PROXY", "value": "http://127.0.0.1:7439"},
        {"name": "HTTP_PROXY", "value": "http://127.0.0.1:7439"},
        {"name": "NO_PROXY", "value": NO_PROXY},
        {"name": "SSL_CERT_FILE", "value": "/etc/kuikproxy/ca/bundle.pem"},
    ]
    original = pod({"name": "app", "image": "app:1", "env": copy.deepcopy(variables)})
    patched, injection = injected(original)
    assert patched["spec"]["containers"][0]["env"] == variables
    assert injection.warnings == ()


def test_no_proxy_and_ssl_cert_file_of_the_container_are_left_with_warnings() -> None:
    """NO_PROXY and SSL_CERT_FILE set by the container (even from a Secret) stay, with what
    that risks."""
    original = pod(
        {
            "name": "app",
            "image": "app:1",
            "env": [
                {"name": "NO_PROXY", "value": "internal.example"},
                {
                    "name": "SSL_CERT_FILE",
                    "valueFrom": {"secretKeyRef": {"name": "roots", "key": "path"}},
                },
            ],
        }
    )
    patched, injection = injected(original)
    assert env(patched["spec"]["containers"][0])["NO_PROXY"] == "internal.example"
    assert injection.warnings == (
        'kuikproxy: container "app" sets NO_PROXY itself, left as it is: '
        "it must keep the Kubernetes API out of the proxy",
        'kuikproxy: container "app" sets SSL_CERT_FILE itself, left as it is: '
        "it may not trust kuikproxy's CA",
    )


def test_a_lower_case_no_proxy_is_kept_inside_the_new_one() -> None:
    """kube-image-keeper's chart sets `no_proxy` (its own registry): Go would read our
    NO_PROXY first, so NO_PROXY carries it through `$(no_proxy)`, defined earlier."""
    patched, injection = injected(kuik_pod())
    variables = patched["spec"]["containers"][0]["env"]
    assert variables[0] == {"name": "no_proxy", "value": "kube-image-keeper-registry"}
    assert env(patched["spec"]["containers"][0])["NO_PROXY"] == NO_PROXY + ",$(no_proxy)"
    assert injection.warnings == ()


def test_every_container_is_proxied_but_init_containers_are_not() -> None:
    """Init containers run before the sidecar starts: a proxy would be a closed port."""
    original = pod(
        {"name": "one", "image": "one:1"},
        {"name": "two", "image": "two:1", "volumeMounts": []},
        initContainers=[{"name": "migrate", "image": "migrate:1"}],
    )
    patched, _ = injected(original)
    one, two, sidecar = patched["spec"]["containers"]
    assert "HTTPS_PROXY" in env(one) and "HTTPS_PROXY" in env(two) and "env" not in sidecar
    assert patched["spec"]["initContainers"] == original["spec"]["initContainers"]


def test_resources_come_from_the_annotations() -> None:
    """kuikproxy.io/cpu is the CPU request; kuikproxy.io/memory the memory request and
    limit."""
    original = pod()
    original["metadata"]["annotations"] = {"kuikproxy.io/cpu": "0.2", "kuikproxy.io/memory": "1Gi"}
    patched, injection = injected(original)
    assert patched["spec"]["containers"][-1]["resources"] == {
        "requests": {"cpu": "0.2", "memory": "1Gi"},
        "limits": {"memory": "1Gi"},
    }
    assert injection.warnings == ()


@pytest.mark.parametrize("value", ["lots", "-1", "0", "1.5.0", "100 m", ""])
def test_an_invalid_resource_annotation_falls_back_to_the_default(value: str) -> None:
    """A value that is not a positive quantity would make the API server refuse the pod: the
    default is used, and a warning says so."""
    original = pod()
    original["metadata"]["annotations"] = {"kuikproxy.io/memory": value}
    patched, injection = injected(original)
    assert patched["spec"]["containers"][-1]["resources"]["limits"] == {"memory": "384Mi"}
    assert injection.warnings == (
        f'kuikproxy: annotation kuikproxy.io/memory: "{value}" is not a positive quantity, '
        "384Mi used instead",
    )


def test_injecting_twice_is_a_no_op() -> None:
    """A pod that has the sidecar gets no patch and no warning."""
    patched, _ = injected(kuik_pod())
    assert plan(patched, SETTINGS) == Injection()


@pytest.mark.parametrize(
    "metadata",
    [{}, {"labels": {}}, {"labels": {"kuikproxy.io/inject": "false"}}, {"labels": None}],
)
def test_a_pod_without_the_label_is_untouched(metadata: dict[str, Any]) -> None:
    """The webhook's objectSelector normally keeps such pods away; if not, nothing happens."""
    original = pod()
    original["metadata"] = metadata
    assert plan(original, SETTINGS) == Injection()


@pytest.mark.parametrize("value", [None, [], "pod", 42])
def test_what_is_not_a_pod_is_untouched(value: Any) -> None:
    """Nothing to read a label from: nothing to do."""
    assert plan(value, SETTINGS) == Injection()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: p.pop("spec"), "the pod has no spec"),
        (lambda p: p["spec"].update(containers=[]), "the pod has no containers"),
        (lambda p: p["spec"].update(containers="app"), "spec.containers is not a list"),
        (
            lambda p: p["spec"]["containers"][0].update(env={"A": "1"}),
            'container "app".env is not a list of objects',
        ),
        (lambda p: p["spec"].update(hostNetwork=True), "the pod uses the node's network"),
        (
            lambda p: p["spec"].update(initContainers=[{"name": "kuikproxy", "image": "x"}]),
            "an init container is already named kuikproxy",
        ),
        (
            lambda p: p["spec"].update(volumes=[{"name": "kuikproxy-tmp", "emptyDir": {}}]),
            'volume "kuikproxy-tmp" already exists',
        ),
        (
            lambda p: p["spec"]["containers"][0].update(
                volumeMounts=[{"name": "roots", "mountPath": "/etc/kuikproxy/ca/"}]
            ),
            'container "app" already mounts something at /etc/kuikproxy/ca',
        ),
    ],
)
def test_a_pod_that_cannot_take_the_whole_patch_gets_none_and_a_warning(
    change: Any, reason: str
) -> None:
    """All or nothing: a partly injected pod would be worse than none. The pod is still
    allowed (the webhook never refuses), with a warning saying why."""
    original = pod()
    change(original)
    injection = plan(original, SETTINGS)
    assert injection.patch == ()
    assert len(injection.warnings) == 1
    assert injection.warnings[0].startswith(f"kuikproxy: sidecar not injected: {reason}")


def test_names_in_warnings_are_cut_short() -> None:
    """Admission runs before validation: a name can be any length, a warning must not."""
    original = pod({"name": "x" * 5000, "image": "app:1", "env": [{"name": "HTTP_PROXY"}]})
    (warning,) = plan(original, SETTINGS).warnings
    assert f'container "{"x" * 63}…" sets HTTP_PROXY' in warning
    assert len(warning) < 200


def test_pointer_tokens_are_escaped() -> None:
    """RFC 6901: `~` becomes `~0` before `/` becomes `~1`, so `~1` in a name stays itself."""
    assert json_pointer(("metadata", "annotations", "kuikproxy.io/a~1b", 0, "-")) == (
        "/metadata/annotations/kuikproxy.io~1a~01b/0/-"
    )


def test_only_pods_being_created_are_injected() -> None:
    """An update passes untouched (containers cannot change after creation); another kind of
    object passes with a warning about the webhook's rules."""
    labelled = pod()
    assert admit(Review("u", "UPDATE", POD_KIND, "ns", labelled), SETTINGS) == Injection()
    assert admit(Review("u", "CREATE", POD_KIND, "ns", labelled), SETTINGS).patch
    deployment = {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert admit(Review("u", "CREATE", deployment, "ns", labelled), SETTINGS) == Injection(
        warnings=("kuikproxy: only Pods are injected; check the webhook's rules",)
    )


def test_settings_are_checked() -> None:
    """A bad name would make every injected pod fail; it is refused at start instead."""
    with pytest.raises(ConfigError) as error:
        SidecarSettings("", "Not_A_Name", "x" * 254, cpu="0", memory="lots")
    assert error.value.errors == [
        "sidecar image: not an image reference: ''",
        "config map: not a Kubernetes object name: 'Not_A_Name'",
        f"CA bundle secret: not a Kubernetes object name: '{'x' * 254}'",
        "default cpu: not a positive quantity: '0'",
        "default memory: not a positive quantity: 'lots'",
    ]


PROXY_SPELLINGS = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY"]
variable_sets = st.lists(
    st.builds(
        lambda name, value: {"name": name, "value": value},
        st.sampled_from([*PROXY_SPELLINGS, "no_proxy", "SSL_CERT_FILE", "OTHER"]),
        st.sampled_from(["http://127.0.0.1:7439", "http://corp:3128", ""]),
    ),
    unique_by=lambda variable: variable["name"],
)


@given(variable_sets)
def test_any_env_is_kept_as_its_prefix_and_no_name_is_repeated(variables: list[Any]) -> None:
    """Whatever a container sets, it stays first and unchanged, no variable is defined
    twice, and the patched pod is valid."""
    original = pod({"name": "app", "image": "app:1", "env": copy.deepcopy(variables)})
    patched, _ = injected(original)
    result = patched["spec"]["containers"][0]["env"]
    assert result[: len(variables)] == variables
    names = [variable["name"] for variable in result]
    assert len(names) == len(set(names))
    # each of Go's proxy variables is now set, by the container or by the webhook
    for upper in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"):
        assert upper in names or upper.lower() in names
