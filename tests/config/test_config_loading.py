"""Loading config files: defaults, the ``default`` merge, and error reporting (SPEC §7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuikproxy.config import (
    PUBLIC_REGISTRIES,
    CheckSettings,
    CopySettings,
    Credentials,
    LimitsSettings,
    QueuingConfiguration,
    QuotaBucket,
    QuotaSettings,
    TLSSettings,
    load_config,
    parse_config,
)
from kuikproxy.core.flowcontrol import FlowTraits
from kuikproxy.core.memorybudget import Bound
from kuikproxy.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config.yaml"


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "test.yaml")
    return caught.value.errors


def test_embedded_default_values() -> None:
    """Without a file: listen 127.0.0.1:7439, docker.io default, check 1m/10s, copy 5m/0."""
    config = load_config(None)
    assert config.listen == "127.0.0.1:7439"
    assert config.listen_address() == ("127.0.0.1", 7439)
    assert config.default_registry == "docker.io"
    assert config.allowed_hosts == PUBLIC_REGISTRIES
    assert dict(config.host_aliases) == {}
    assert config.resource_identity == ("header:Kuik-Resource", "proxyUser", "clientAddress")
    assert config.unused_image_retention == 86400.0
    assert (config.cache.max_age, config.cache.max_entries, config.cache.max_bytes) == (
        3600.0, None, None
    )  # fmt: skip
    memory, source = config.memory()  # the cgroup's limit where there is one, else the chart's
    assert source != "default" or memory == 512 * 1024**2
    assert not config.budget().over  # every bound sized from the budget fits in it
    assert config.state.path is None
    assert config.configured_hosts() == ()
    settings = config.registry("docker.io")
    assert settings.check == CheckSettings(
        interval=60.0, timeout=10.0, mode="hold", max_hold=0.0, follow_up=2.0
    )
    assert settings.copy == CopySettings(interval=300.0, timeout=0.0, idle=5.0)
    assert settings.paced is True
    assert settings.credentials is None
    assert settings.tls == TLSSettings(ca_file=None, insecure_skip_verify=False)


NO_DOCUMENT = {
    "empty": "",
    "blank": "  \n\n    \n",
    "comments": "# the registries are below\n# (they are not)\n",
    "null": "null\n",
    "tilde": "~\n",
    "document-start": "---\n",
    "document-start-and-end": "--- # nothing\n...\n",
    "empty-mapping": "{}\n",
    "empty-mapping-commented": "--- {}  # every host below was removed\n",
}
"""Files with no settings in them: no YAML document, a null one, or a mapping without a key."""


def nothing_in(path: Path) -> str:
    """The error for a file in :data:`NO_DOCUMENT`: it names the file and says how to run on
    the embedded default."""
    return (
        f"{path}: no settings in it (empty, comments only, null or {{}}); "
        "serve without --config runs on the embedded default"
    )


@pytest.mark.parametrize("text", NO_DOCUMENT.values(), ids=NO_DOCUMENT.keys())
def test_a_file_without_a_document_is_refused(tmp_path: Path, text: str) -> None:
    """A file with no settings in it is refused, never read as the embedded default: the file
    was named, and one truncated, emptied or templated to ``{}`` by mistake would otherwise
    drop every host it configures."""
    path = tmp_path / "kuikproxy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.errors == [nothing_in(path)]


def test_a_file_with_one_setting_is_not_empty(tmp_path: Path) -> None:
    """The rule is "no settings at all": one key, even one that leaves its block empty, is a
    config (the embedded default with that key)."""
    path = tmp_path / "kuikproxy.yaml"
    path.write_text("registries: {}\n")
    assert load_config(path) == load_config(None)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}"])
def test_an_empty_text_is_the_embedded_default(text: str) -> None:
    """Text given in code (not a file an operator named) may leave everything out."""
    assert parse_config(text) == load_config(None)


def test_host_block_overrides_only_what_it_sets() -> None:
    """The ``default`` block is merged under a host's block key by key, nested blocks too."""
    config = parse_config(
        """
registries:
  default:
    check: {interval: 2m, timeout: 20s, mode: prefetch}
    copy: {idle: 9s}
    tls: {caFile: /ca.pem}
  docker.io:
    check: {interval: 30s}
    tls: {insecureSkipVerify: true}
  quay.io: {}
"""
    )
    docker = config.registry("docker.io")
    assert docker.check == CheckSettings(interval=30.0, timeout=20.0, mode="prefetch")
    assert docker.copy == CopySettings(idle=9.0)
    assert docker.tls == TLSSettings(ca_file="/ca.pem", insecure_skip_verify=True)
    assert config.registry("quay.io").check.interval == 120.0
    # A host with no block of its own gets the default block alone.
    other = config.registry("unconfigured.example")
    assert other.check == CheckSettings(interval=120.0, timeout=20.0, mode="prefetch")
    assert other is config.registry("default")
    assert config.configured_hosts() == ("docker.io", "quay.io")


def test_host_block_without_value_is_configured() -> None:
    """``host:`` with no value configures (and allows) that host with the default settings."""
    config = parse_config(
        "allowedHosts: []\ndefaultRegistry: reg.example:5000\nregistries:\n  reg.example:5000:\n"
    )
    assert config.configured_hosts() == ("reg.example:5000",)
    assert config.is_allowed("reg.example:5000")


def test_snake_and_camel_keys_merge_as_one() -> None:
    """A default ``max_hold`` and a host ``maxHold`` are one key: the host's wins."""
    config = parse_config(
        "registries:\n  default: {check: {max_hold: 5s}}\n  ghcr.io: {check: {maxHold: 7s}}\n"
    )
    assert config.registry("ghcr.io").check.max_hold == 7.0


def test_durations_accept_strings_and_numbers() -> None:
    """Every duration takes Go-style strings or numbers of seconds."""
    config = parse_config(
        """
unusedImageRetention: 1h30m
cache: {maxAge: 90, maxBytes: 128Mi}
registries:
  default: {check: {interval: 1.5, timeout: 250ms, followUp: "3"}, copy: {timeout: 1h}}
"""
    )
    assert config.unused_image_retention == 5400.0
    assert config.cache.max_age == 90.0
    assert config.cache.max_bytes == 128 * 1024**2
    check = config.registry("x.example").check
    assert (check.interval, check.timeout, check.follow_up) == (1.5, 0.25, 3.0)
    assert config.registry("x.example").copy.timeout == 3600.0


@pytest.mark.parametrize(
    ("key", "canonical"),
    [
        ("index.docker.io", "docker.io"),
        ("registry-1.docker.io", "docker.io"),
        ("GHCR.IO", "ghcr.io"),
    ],
)
def test_host_keys_are_normalised(key: str, canonical: str) -> None:
    """Host keys are lowercased and Docker Hub's other names mean docker.io."""
    config = parse_config(f"registries:\n  {key}: {{check: {{interval: 7s}}}}\n")
    assert config.configured_hosts() == (canonical,)
    assert config.registry(key).check.interval == 7.0
    assert config.registry(canonical).check.interval == 7.0


def test_default_registry_is_normalised() -> None:
    """``defaultRegistry: index.docker.io`` means docker.io."""
    assert parse_config("defaultRegistry: Index.Docker.io").default_registry == "docker.io"


def test_duplicate_host_after_normalisation() -> None:
    """Two keys naming the same registry are refused: they would share one budget."""
    errors = errors_of("registries:\n  docker.io: {}\n  index.docker.io: {}\n")
    assert errors == ['registries.index.docker.io: the same host as "docker.io"']


def test_error_path_and_reason() -> None:
    """An invalid duration is reported with its full path, as SPEC §7 quotes it."""
    errors = errors_of("registries:\n  docker.io:\n    check: {interval: 1x}\n")
    assert errors == ['registries.docker.io.check.interval: invalid duration "1x"']


def test_every_error_is_reported() -> None:
    """All errors of a file are reported at once, each with its path."""
    errors = errors_of(
        """
listen: nowhere
cache: {maxBytes: lots}
registries:
  default: {copy: {interval: 0}}
  docker.io: {check: {interval: 1x, mode: sometimes}}
  ghcr.io: {credentials: {username: bot}}
"""
    )
    assert set(errors) == {
        'listen: invalid listen address "nowhere" (expected host:port)',
        'cache.maxBytes: invalid size "lots"',
        "registries.default.copy.interval: must be greater than 0",
        'registries.docker.io.check.interval: invalid duration "1x"',
        "registries.docker.io.check.mode: Input should be 'hold' or 'prefetch'",
        "registries.ghcr.io.credentials: username and passwordFile go together",
    }


def test_two_errors_in_one_block() -> None:
    """Two errors in the same block are both reported."""
    errors = errors_of("registries:\n  quay.io: {check: {interval: -1s, timeout: x}}\n")
    assert len(errors) == 2
    assert errors[0].startswith("registries.quay.io.check.interval: ")
    assert errors[1] == 'registries.quay.io.check.timeout: invalid duration "x"'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("quota: {}", "quota: unknown key"),
        ("flowControl: {priorityLevel: []}", "flowControl.priorityLevel: unknown key"),
        ("fleet: {redis: {url: redis://x}, size: 3}", "fleet.size: unknown key"),
        ("forwardProxy: {enable: true}", "forwardProxy.enable: unknown key"),
        ("cache: {maxAgee: 1h}", "cache.maxAgee: unknown key"),
        (
            "registries: {docker.io: {quota: {presets: dockerhub-authenticated}}}",
            "registries.docker.io.quota.presets: unknown key",
        ),
        (
            "registries: {default: {check: {every: 1m}}}",
            "registries.default.check.every: unknown key",
        ),
    ],
)
def test_unknown_keys(text: str, error: str) -> None:
    """Unknown keys are refused: top-level quota (it is per host), typos."""
    assert errors_of(text) == [error]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("listen: [", "test.yaml: invalid YAML at line 1, column 10"),
        ("a: 1\n b: 2\n", "test.yaml: invalid YAML at line 2, column 3"),
        ("listen: a\nlisten: b\n", 'found duplicate key "listen"'),
    ],
)
def test_yaml_syntax_errors(text: str, error: str) -> None:
    """YAML syntax errors (and duplicate keys) are one ConfigError naming file and line."""
    errors = errors_of(text)
    assert len(errors) == 1
    assert error in errors[0]


@pytest.mark.parametrize(
    ("text", "kind"), [("- a\n- b\n", "a list"), ("just text", "a string"), ("3", "a number")]
)
def test_top_level_must_be_a_mapping(text: str, kind: str) -> None:
    """A top level that is not a mapping is a ConfigError, not a crash."""
    assert errors_of(text) == [f"test.yaml: the top level must be a mapping, not {kind}"]


def test_wrong_block_types() -> None:
    """Blocks that are not mappings are reported with their path."""
    errors = errors_of("registries: [docker.io]\ncache: 5\n")
    assert set(errors) == {
        "registries: must be a mapping of host to settings, not a list",
        "cache: must be a mapping, not a number",
    }
    assert errors_of('allowedHosts: "*.example"') == ["allowedHosts: must be a list, not a string"]
    assert errors_of("registries: {ghcr.io: {check: fast}}") == [
        "registries.ghcr.io.check: must be a mapping, not a string"
    ]


@pytest.mark.parametrize(
    "key", ["upstream: https://mirror.example", "credentials: {dockerConfigFile: /c}"]
)
def test_host_only_keys_refused_in_default(key: str) -> None:
    """``upstream`` and ``credentials`` in ``default`` would apply to every host: refused."""
    name = key.split(":", maxsplit=1)[0]
    assert errors_of(f"registries:\n  default:\n    {key}\n") == [
        f"registries.default.{name}: not allowed in the default block (it belongs to one host)"
    ]


def test_credentials() -> None:
    """Credentials are username+passwordFile or dockerConfigFile, exactly one of the two."""
    config = parse_config(
        "registries:\n"
        "  docker.io: {credentials: {username: bot, passwordFile: /s/p}}\n"
        "  ghcr.io: {credentials: {dockerConfigFile: /s/c.json}}\n"
    )
    assert config.registry("docker.io").credentials == Credentials(
        username="bot", password_file="/s/p"
    )
    assert config.registry("ghcr.io").credentials == Credentials(docker_config_file="/s/c.json")
    both = "{username: a, passwordFile: /p, dockerConfigFile: /c}"
    assert errors_of(f"registries: {{quay.io: {{credentials: {both}}}}}") == [
        "registries.quay.io.credentials: "
        "set either username and passwordFile, or dockerConfigFile, not both"
    ]
    assert errors_of("registries: {quay.io: {credentials: {}}}") == [
        "registries.quay.io.credentials: set username and passwordFile, or dockerConfigFile"
    ]


@pytest.mark.parametrize(
    "text",
    [
        "resourceIdentity: [header:Kuik-Resource, podName]",
        "resourceIdentity: ['header:']",
        "resourceIdentity: []",
    ],
)
def test_resource_identity_validated(text: str) -> None:
    """resourceIdentity takes header:<Name>, proxyUser and clientAddress only, at least one."""
    [error] = errors_of(text)
    assert error.startswith("resourceIdentity")


def test_resource_identity_error_names_the_item() -> None:
    """A bad resourceIdentity entry is reported with its index."""
    assert errors_of("resourceIdentity: [proxyUser, podName]") == [
        'resourceIdentity[1]: unknown resource identity "podName" '
        "(expected header:<Name>, proxyUser or clientAddress)"
    ]


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("127.0.0.1:7439", ("127.0.0.1", 7439)),
        ("[::1]:80", ("::1", 80)),
        (":7439", ("", 7439)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_listen_address(listen: str, address: tuple[str, int]) -> None:
    """listen is host:port, [v6]:port, or :port for every address."""
    assert parse_config(f'listen: "{listen}"').listen_address() == address


@pytest.mark.parametrize("listen", ["7439", "::1:80", "host:99999", "host:", "[nope]:80"])
def test_listen_invalid(listen: str) -> None:
    """An unusable listen address is refused at load time, not when binding."""
    [error] = errors_of(f'listen: "{listen}"')
    assert error.startswith("listen: invalid listen address")


def test_default_registry_must_be_allowed() -> None:
    """Requests would be routed to defaultRegistry, so it must be allowed to be contacted."""
    assert errors_of("allowedHosts: []\n") == [
        'defaultRegistry: host "docker.io" is not allowed '
        "(give it a registries block or match it in allowedHosts)"
    ]
    assert errors_of("defaultRegistry: reg.example\nhostAliases: {m.local: evil.example}") == [
        'defaultRegistry: host "reg.example" is not allowed '
        "(give it a registries block or match it in allowedHosts)",
        'hostAliases.m.local: host "evil.example" is not allowed '
        "(give it a registries block or match it in allowedHosts)",
    ]


def test_host_aliases_normalised() -> None:
    """hostAliases keys are lowercased Host headers; targets are normalised hosts."""
    config = parse_config("hostAliases: {Mirror.Docker.Local: index.docker.io}")
    assert dict(config.host_aliases) == {"mirror.docker.local": "docker.io"}


def test_load_config_from_file(tmp_path: Path) -> None:
    """load_config reads a file; an unreadable file is a ConfigError naming it."""
    path = tmp_path / "kuik.yaml"
    path.write_text("listen: ':9000'\n")
    assert load_config(path).listen_address() == ("", 9000)
    assert load_config(str(path)).listen == ":9000"
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "missing.yaml")
    assert caught.value.errors == [f"{tmp_path / 'missing.yaml'}: No such file or directory"]


def test_example_config_loads() -> None:
    """examples/config.yaml is valid and says what it claims to."""
    config = load_config(EXAMPLE)
    assert config.configured_hosts() == ("docker.io", "ghcr.io", "registry.internal:5000")
    assert config.registry("docker.io").check.interval == 30.0
    assert config.registry("ghcr.io").check.mode == "prefetch"
    internal = config.registry("registry.internal:5000")
    assert internal.paced is False
    assert internal.upstream_url("registry.internal:5000") == "http://registry.internal:5000"


def test_example_config_quota_and_flow_control() -> None:
    """examples/config.yaml sets quotas and flow control, on top of the built-in baseline."""
    config = load_config(EXAMPLE)
    docker = config.registry("docker.io").quota
    assert (docker.preset, docker.buckets, docker.learns_from_headers) == (
        "dockerhub-authenticated",
        (),
        True,
    )
    assert config.registry("ghcr.io").quota == QuotaSettings(
        buckets=(QuotaBucket("DataplaneRead", "identity", 1000.0, 20),)
    )
    assert config.registry("registry.internal:5000").quota == QuotaSettings()
    flow = config.flow_control
    assert flow.server_concurrency_limit == 64
    assert [level.name for level in flow.priority_levels] == [
        "exempt",
        "checks",
        "copies",
        "catch-all",
        "monitoring",
    ]
    monitoring = flow.level("monitoring").limited
    assert monitoring is not None
    assert monitoring.nominal_concurrency_shares == 10
    assert monitoring.lendable_percent == 50
    assert monitoring.borrowing_limit_percent == 100
    assert monitoring.limit_response.queuing == QueuingConfiguration(64, 8, 500)
    assert [s.name for s in flow.flow_schemas] == [
        "exempt",
        "image-monitors",
        "checks",
        "copies",
        "catch-all",
    ]
    match = flow.match(FlowTraits("ImageMonitor/default/web", "docker.io", "check"))
    assert match is not None
    assert match.priority_level == "monitoring"


def test_example_config_commented_examples_are_valid(tmp_path: Path) -> None:
    """The commented-out ACR host and `checks` override in the example load when uncommented."""
    text = EXAMPLE.read_text()
    for block in ("  # myregistry.azurecr.io:\n", "    # - name: checks\n"):
        head, sep, rest = text.partition(block)
        assert sep, block
        indent = block[: block.index("#")]
        lines = (block + rest).split("\n")
        taken = []
        for line in lines:
            if not line.startswith(indent + "#"):
                break
            taken.append(indent + line[len(indent) + 2 :])
        text = head + "\n".join(taken + lines[len(taken) :])
    path = tmp_path / "uncommented.yaml"
    path.write_text(text)
    config = load_config(path)
    acr = config.registry("myregistry.azurecr.io").quota
    assert acr.preset == "acr-standard"
    assert acr.bucket("DataplaneRead", "identity") == QuotaBucket(
        "DataplaneRead", "identity", 2500.0, 42
    )
    checks = config.flow_control.level("checks").limited
    assert checks is not None
    assert checks.limit_response.queuing == QueuingConfiguration(64, 8, 5000)


def test_limits_are_counts_above_zero() -> None:
    """``limits``: camelCase keys, each a count above zero, defaults for the rest;
    every mistake reported with its path."""
    assert parse_config("limits: {maxResources: 50}").limits == LimitsSettings(max_resources=50)
    with pytest.raises(ConfigError) as caught:
        parse_config("limits: {maxHosts: 0, maxImages: many, maxRing: 1}")
    assert caught.value.errors == [
        "limits.maxHosts: must be greater than 0",
        "limits.maxImages: Input should be a valid integer",
        "limits.maxRing: unknown key",
    ]


def test_bounds_written_past_the_memory_budget_are_refused() -> None:
    """The old defaults written out (256Mi of kept answers, a million images) do not fit the
    chart's 512Mi with the rest: refused, saying by how much; with a budget they fit, accepted,
    and the bounds left unset share what they leave."""
    old = "cache: {maxBytes: 256Mi, maxEntries: 100000}\nlimits: {maxImages: 1000000}\n"
    errors = errors_of(old)
    assert len(errors) == 1 and errors[0].startswith("limits.memory: the bounds written (")
    assert "lower them or raise limits.memory" in errors[0]
    config = parse_config(old.replace("limits: {", "limits: {memory: 2Gi, "))
    budget = config.budget()
    assert not budget.over and budget.value(Bound.IMAGES) == 1_000_000
    assert budget.value(Bound.HOSTS) > 0 and not budget.shares[-1].set
