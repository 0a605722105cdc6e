"""The kuikproxy configuration (SPEC §7): models, loading, and the ``check-config`` text."""

from kuikproxy.config.describe import describe
from kuikproxy.config.fields import validate_host
from kuikproxy.config.flowsettings import FlowControl
from kuikproxy.config.flowsettings import validated_level as PriorityLevel
from kuikproxy.config.loading import (
    EMBEDDED_DEFAULT_SOURCE,
    build_config,
    load_config,
    parse_config,
)
from kuikproxy.config.models import PUBLIC_REGISTRIES, Config
from kuikproxy.config.process import (
    BlobStoreSettings,
    CacheSettings,
    FleetSettings,
    ForwardProxyCA,
    ForwardProxySettings,
    LimitsSettings,
    StateSettings,
)
from kuikproxy.config.quotas import (
    QUOTA_PRESETS,
    QuotaBucket,
    QuotaCategory,
    QuotaPreset,
    QuotaScope,
    QuotaSettings,
)
from kuikproxy.config.registry import (
    DOCKER_HUB_UPSTREAM,
    CheckSettings,
    CopySettings,
    Credentials,
    RegistrySettings,
    TLSSettings,
)
from kuikproxy.core.flowcontrol import (
    BUILTIN_FLOW_SCHEMAS,
    BUILTIN_PRIORITY_LEVELS,
    ExemptPriorityLevelConfiguration,
    FlowDistinguisherMethod,
    FlowRule,
    FlowSchema,
    HeaderMatch,
    LimitedPriorityLevelConfiguration,
    LimitResponse,
    PriorityLevelReference,
    QueuingConfiguration,
)
from kuikproxy.core.images import DOCKER_HUB, normalize_host

__all__ = [
    "BUILTIN_FLOW_SCHEMAS",
    "BUILTIN_PRIORITY_LEVELS",
    "DOCKER_HUB",
    "DOCKER_HUB_UPSTREAM",
    "EMBEDDED_DEFAULT_SOURCE",
    "PUBLIC_REGISTRIES",
    "QUOTA_PRESETS",
    "BlobStoreSettings",
    "CacheSettings",
    "CheckSettings",
    "Config",
    "CopySettings",
    "Credentials",
    "ExemptPriorityLevelConfiguration",
    "FleetSettings",
    "FlowControl",
    "FlowDistinguisherMethod",
    "FlowRule",
    "FlowSchema",
    "ForwardProxyCA",
    "ForwardProxySettings",
    "HeaderMatch",
    "LimitResponse",
    "LimitedPriorityLevelConfiguration",
    "LimitsSettings",
    "PriorityLevel",
    "PriorityLevelReference",
    "QueuingConfiguration",
    "QuotaBucket",
    "QuotaCategory",
    "QuotaPreset",
    "QuotaScope",
    "QuotaSettings",
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
