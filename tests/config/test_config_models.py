"""Config lookups: allowed hosts, upstream URLs and model-level validation (SPEC §3, §3.1)."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from kuikproxy.config import (
    CheckSettings,
    Config,
    RegistrySettings,
    load_config,
    normalize_host,
    parse_config,
)


@pytest.mark.parametrize(
    "host",
    [
        "docker.io",
        "index.docker.io",
        "registry-1.docker.io",
        "ghcr.io",
        "quay.io",
        "registry.k8s.io",
        "gcr.io",
        "eu.gcr.io",
        "europe-docker.pkg.dev",
        "public.ecr.aws",
        "mcr.microsoft.com",
        "myreg.azurecr.io",
        "MyReg.AzureCR.io",
    ],
)
def test_embedded_default_allows_public_registries(host: str) -> None:
    """Without allowedHosts the well-known public registries are allowed."""
    assert load_config(None).is_allowed(host)


@pytest.mark.parametrize(
    "host",
    ["example.com", "localhost", "169.254.169.254", "azurecr.io", "gcr.io.evil.com", "", "default"],
)
def test_embedded_default_refuses_others(host: str) -> None:
    """Any other host is not allowed: kuikproxy is not an open proxy."""
    assert not load_config(None).is_allowed(host)


def test_explicit_allowed_hosts_replace_public_list() -> None:
    """An allowedHosts key replaces the public list; configured hosts stay allowed."""
    config = parse_config(
        "allowedHosts: ['*.azurecr.io', 'Reg.Example:5000']\nregistries: {docker.io: {}}\n"
    )
    assert config.is_allowed("a.azurecr.io")
    assert config.is_allowed("reg.example:5000")
    assert config.is_allowed("docker.io")  # configured
    assert config.is_allowed("index.docker.io")  # the same host
    assert not config.is_allowed("ghcr.io")  # public, but no longer listed
    assert not config.is_allowed("reg.example")  # the port is part of the host


def test_configured_host_is_allowed() -> None:
    """A host with a registries block is allowed even if no pattern matches it."""
    config = parse_config("registries: {registry.internal:5000: {paced: false}}")
    assert config.is_allowed("registry.internal:5000")
    assert config.is_allowed("ghcr.io")


@pytest.mark.parametrize(
    ("host", "upstream", "url"),
    [
        ("docker.io", None, "https://registry-1.docker.io"),
        ("index.docker.io", None, "https://registry-1.docker.io"),
        ("ghcr.io", None, "https://ghcr.io"),
        ("reg.example:5000", None, "https://reg.example:5000"),
        ("reg.example", "http://10.0.0.5:5000", "http://10.0.0.5:5000"),
        ("reg.example", "https://Mirror.Example/", "https://mirror.example"),
        ("reg.example", "http://[fd00::5]:5000", "http://[fd00::5]:5000"),
    ],
)
def test_upstream_url(host: str, upstream: str | None, url: str) -> None:
    """The endpoint is the explicit upstream, else registry-1.docker.io or https://<host>."""
    assert RegistrySettings(upstream=upstream).upstream_url(host) == url


@pytest.mark.parametrize(
    "upstream",
    [
        "ftp://reg.example",
        "reg.example:5000",
        "https://",
        "https://reg.example/v2/",
        "https://reg.example?x=1",
        "https://user:pass@reg.example",
        "https://reg.example:99999",
    ],
)
def test_upstream_invalid(upstream: str) -> None:
    """An upstream is an http(s) URL with a host and nothing after it."""
    text = f"registries: {{reg.example: {{upstream: '{upstream}'}}}}"
    with pytest.raises(Exception) as caught:
        parse_config(text)
    assert "registries.reg.example.upstream: invalid upstream" in str(caught.value)


def test_models_are_frozen_and_validated() -> None:
    """Models are immutable and validate when built directly from Python too."""
    settings = CheckSettings(interval="30s")  # type: ignore[arg-type]
    assert settings.interval == 30.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.interval = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        CheckSettings(interval=0)


def test_config_built_in_python_has_a_default_block() -> None:
    """A Config built without registries still answers registry() for any host."""
    config = Config(registries={"GHCR.io": RegistrySettings(paced=False)})
    assert config.configured_hosts() == ("ghcr.io",)
    assert config.registry("ghcr.io").paced is False
    assert config.registry("quay.io") == RegistrySettings()


@pytest.mark.parametrize(
    ("host", "normal"),
    [("Docker.IO", "docker.io"), ("index.docker.io", "docker.io"), ("ghcr.io.", "ghcr.io")],
)
def test_normalize_host(host: str, normal: str) -> None:
    """Hosts compare lowercase, and Docker Hub's other names are docker.io."""
    assert normalize_host(host) == normal


@pytest.mark.parametrize(
    "key", ["https://reg.example", "reg.example/path", "reg example", "a:99999"]
)
def test_invalid_host_keys(key: str) -> None:
    """A registries key must be host or host:port."""
    with pytest.raises(Exception) as caught:
        parse_config(f"registries: {{'{key}': {{}}}}")
    assert f"registries.{key}: invalid host" in str(caught.value)
