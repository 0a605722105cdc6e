"""The kuikproxy configuration (SPEC §7): models, loading, and the ``check-config`` text."""

from kuikproxy.config.describe import describe
from kuikproxy.config.loading import (
    EMBEDDED_DEFAULT_SOURCE,
    build_config,
    load_config,
    parse_config,
)
from kuikproxy.config.models import (
    DOCKER_HUB,
    DOCKER_HUB_UPSTREAM,
    PUBLIC_REGISTRIES,
    CacheSettings,
    CheckSettings,
    Config,
    CopySettings,
    Credentials,
    RegistrySettings,
    StateSettings,
    TLSSettings,
    normalize_host,
    validate_host,
)

__all__ = [
    "DOCKER_HUB",
    "DOCKER_HUB_UPSTREAM",
    "EMBEDDED_DEFAULT_SOURCE",
    "PUBLIC_REGISTRIES",
    "CacheSettings",
    "CheckSettings",
    "Config",
    "CopySettings",
    "Credentials",
    "RegistrySettings",
    "StateSettings",
    "TLSSettings",
    "build_config",
    "describe",
    "load_config",
    "normalize_host",
    "parse_config",
    "validate_host",
]
