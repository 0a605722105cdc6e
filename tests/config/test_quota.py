"""``registries.<host>.quota`` (SPEC §11): presets, explicit buckets, merging from default."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kuikproxy.config import (
    QUOTA_PRESETS,
    QuotaBucket,
    QuotaSettings,
    RegistrySettings,
    describe,
    load_config,
    parse_config,
)
from kuikproxy.errors import ConfigError


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "test.yaml")
    return caught.value.errors


def rates(quota: QuotaSettings) -> dict[tuple[str, str], float]:
    return {(b.category, b.scope): b.rate_per_minute for b in quota.buckets}


def test_no_quota_by_default() -> None:
    """Without a quota block a host rations nothing."""
    config = load_config(None)
    assert config.registry("docker.io").quota == QuotaSettings(preset=None, buckets=())
    assert RegistrySettings().quota.buckets == ()
    assert not config.registry("docker.io").quota.learns_from_headers


@pytest.mark.parametrize("preset", ["acr-basic", "acr-standard"])
def test_acr_basic_and_standard(preset: str) -> None:
    """SPEC §11: read 10000/5000, write 2000/1000, delete 1000/500, referrers 500/250, OAuth."""
    quota = (
        parse_config(f"registries: {{r.azurecr.io: {{quota: {{preset: {preset}}}}}}}")
        .registry("r.azurecr.io")
        .quota
    )
    assert quota.preset == preset
    assert rates(quota) == {
        ("DataplaneRead", "registry"): 10000,
        ("DataplaneRead", "identity"): 5000,
        ("DataplaneWrite", "registry"): 2000,
        ("DataplaneWrite", "identity"): 1000,
        ("DataplaneDelete", "registry"): 1000,
        ("DataplaneDelete", "identity"): 500,
        ("ListReferrers", "registry"): 500,
        ("ListReferrers", "identity"): 250,
        ("OAuth", "registry"): 10000,
    }


def test_acr_premium() -> None:
    """SPEC §11: 20000/10000, 4000/2000, 4000/2000, 2000/1000, OAuth 20000."""
    quota = QuotaSettings(preset="acr-premium")
    assert rates(quota) == {
        ("DataplaneRead", "registry"): 20000,
        ("DataplaneRead", "identity"): 10000,
        ("DataplaneWrite", "registry"): 4000,
        ("DataplaneWrite", "identity"): 2000,
        ("DataplaneDelete", "registry"): 4000,
        ("DataplaneDelete", "identity"): 2000,
        ("ListReferrers", "registry"): 2000,
        ("ListReferrers", "identity"): 1000,
        ("OAuth", "registry"): 20000,
    }
    assert quota.buckets == QUOTA_PRESETS["acr-premium"]


def test_preset_bursts_are_one_second_of_tokens() -> None:
    """A preset bucket holds ceil(ratePerMinute / 60) tokens."""
    quota = QuotaSettings(preset="acr-basic")
    assert quota.bucket("DataplaneRead", "registry") == QuotaBucket(
        category="DataplaneRead", scope="registry", rate_per_minute=10000.0, burst=167
    )
    assert quota.bucket("ListReferrers", "identity") == QuotaBucket(
        "ListReferrers", "identity", 250.0, 5
    )
    assert quota.bucket("OAuth", "identity") is None


def test_a_share_scales_a_presets_rates_and_bursts_not_explicit_buckets() -> None:
    """``share: 0.012`` of acr-basic: reads 120/min per registry (burst 2), 60 per identity
    (burst 1); an explicit bucket stays as written; check-config says the share."""
    config = parse_config(
        "registries:\n  r.azurecr.io:\n    quota:\n      preset: acr-basic\n"
        "      share: 0.012\n"
        "      buckets: [{category: OAuth, scope: registry, ratePerMinute: 30, burst: 3}]\n"
    )
    quota = config.registry("r.azurecr.io").quota
    assert rates(quota)[("DataplaneRead", "registry")] == pytest.approx(120.0)
    assert rates(quota)[("DataplaneRead", "identity")] == pytest.approx(60.0)
    bursts = {(b.category, b.scope): b.burst for b in quota.buckets}
    assert (bursts[("DataplaneRead", "registry")], bursts[("DataplaneRead", "identity")]) == (2, 1)
    assert quota.bucket("OAuth", "registry") == QuotaBucket("OAuth", "registry", 30.0, 3)
    text = describe(config)
    assert "  quota: preset acr-basic at share 0.012\n" in text
    assert "    OAuth per registry: 30/min, burst 3 (explicit)\n" in text
    assert "    ListReferrers per registry: 6/min, burst 1\n" in text


@pytest.mark.parametrize("share", ["0", "1.5", "-1", "true"])
def test_a_share_is_more_than_0_and_at_most_1(share: str) -> None:
    (error,) = errors_of(
        f"registries: {{r.example: {{quota: {{preset: acr-basic, share: {share}}}}}}}"
    )
    assert error.startswith("registries.r.example.quota.share: ")


@pytest.mark.parametrize("preset", ["dockerhub-anonymous", "dockerhub-authenticated"])
def test_docker_hub_presets_learn_from_headers(preset: str) -> None:
    """Docker Hub's limits come from its ratelimit headers: no fixed buckets."""
    quota = (
        parse_config(f"registries: {{docker.io: {{quota: {{preset: {preset}}}}}}}")
        .registry("docker.io")
        .quota
    )
    assert quota.preset == preset
    assert quota.buckets == ()
    assert quota.learns_from_headers


def test_explicit_buckets_replace_or_add() -> None:
    """An explicit bucket replaces the preset's of its category and scope, or is added."""
    quota = (
        parse_config(
            """
registries:
  r.azurecr.io:
    quota:
      preset: acr-standard
      buckets:
        - {category: OAuth, scope: identity, ratePerMinute: 60, burst: 3}
        - {category: DataplaneRead, scope: identity, ratePerMinute: 2500.5, burst: 42}
"""
        )
        .registry("r.azurecr.io")
        .quota
    )
    assert quota.bucket("DataplaneRead", "identity") == QuotaBucket(
        "DataplaneRead", "identity", 2500.5, 42
    )
    assert quota.bucket("OAuth", "identity") == QuotaBucket("OAuth", "identity", 60.0, 3)
    assert quota.bucket("DataplaneRead", "registry") == QuotaBucket(
        "DataplaneRead", "registry", 10000.0, 167
    )
    assert len(quota.buckets) == 10
    # Sorted by category, then scope (registry first).
    assert [b.key for b in quota.buckets][:3] == [
        ("DataplaneRead", "registry"),
        ("DataplaneRead", "identity"),
        ("DataplaneWrite", "registry"),
    ]


def test_buckets_without_preset() -> None:
    """Buckets alone are a quota of their own; integer rates become floats."""
    quota = QuotaSettings(buckets=(QuotaBucket("OAuth", "registry", 10, 1),))  # type: ignore[arg-type]
    assert quota.preset is None
    assert quota.buckets == (QuotaBucket("OAuth", "registry", 10.0, 1),)
    assert isinstance(quota.buckets[0].rate_per_minute, float)


# --- merging from default ---------------------------------------------------------------------


MERGE = """
registries:
  default:
    quota:
      preset: acr-basic
      buckets: [{category: OAuth, scope: identity, ratePerMinute: 100, burst: 2}]
  a.azurecr.io: {}
  b.azurecr.io:
    quota: {buckets: [{category: DataplaneRead, scope: identity, ratePerMinute: 1, burst: 1}]}
  c.azurecr.io:
    quota: {preset: acr-premium}
  d.example:
    quota: {preset: null, buckets: []}
  e.example:
    quota: {preset: null}
"""


def test_quota_merges_from_default() -> None:
    """quota merges key by key: a host keeps the default's preset or buckets unless it sets them."""
    config = parse_config(MERGE)
    default = config.registry("default").quota
    assert default.preset == "acr-basic"
    assert default.bucket("OAuth", "identity") == QuotaBucket("OAuth", "identity", 100.0, 2)
    # No quota of its own, and any host without a block: the default's.
    assert config.registry("a.azurecr.io").quota == default
    assert config.registry("z.azurecr.io").quota == default
    # Its buckets replace the default's buckets (lists are replaced whole); the preset stays.
    b = config.registry("b.azurecr.io").quota
    assert b.preset == "acr-basic"
    assert b.bucket("DataplaneRead", "identity") == QuotaBucket("DataplaneRead", "identity", 1, 1)
    assert b.bucket("OAuth", "identity") is None
    # Its preset replaces the default's; the default's explicit bucket still applies.
    c = config.registry("c.azurecr.io").quota
    assert c.preset == "acr-premium"
    assert rates(c)[("DataplaneRead", "registry")] == 20000
    assert c.bucket("OAuth", "identity") == QuotaBucket("OAuth", "identity", 100.0, 2)
    # preset: null and buckets: [] drop what the default sets.
    assert config.registry("d.example").quota == QuotaSettings()
    e = config.registry("e.example").quota
    assert e.preset is None
    assert e.buckets == (QuotaBucket("OAuth", "identity", 100.0, 2),)


# --- validation -------------------------------------------------------------------------------


def bucket_error(bucket: str) -> list[str]:
    return errors_of(f"registries:\n  r.example:\n    quota:\n      buckets: [{bucket}]\n")


@pytest.mark.parametrize(
    ("bucket", "error"),
    [
        (
            "{category: OAuth, scope: registry, ratePerMinute: 0, burst: 1}",
            "ratePerMinute: must be greater than 0",
        ),
        (
            "{category: OAuth, scope: registry, ratePerMinute: -2.5, burst: 1}",
            "ratePerMinute: must be greater than 0",
        ),
        (
            "{category: OAuth, scope: registry, ratePerMinute: .inf, burst: 1}",
            "ratePerMinute: must be a finite number",
        ),
        (
            "{category: OAuth, scope: registry, ratePerMinute: true, burst: 1}",
            "ratePerMinute: must be a number",
        ),
        (
            "{category: OAuth, scope: registry, ratePerMinute: lots, burst: 1}",
            "ratePerMinute: Input should be a valid number, unable to parse string as a number",
        ),
        (
            "{category: OAuth, scope: registry, ratePerMinute: 1, burst: 0}",
            "burst: must be greater than 0",
        ),
        (
            "{category: OAuth, scope: registry, ratePerMinute: 1, burst: -1}",
            "burst: must be greater than 0",
        ),
        (
            "{category: OAuth, scope: registry, ratePerMinute: 1, burst: 1.5}",
            "burst: Input should be a valid integer",
        ),
        (
            "{category: Pull, scope: registry, ratePerMinute: 1, burst: 1}",
            "category: Input should be 'DataplaneRead', 'DataplaneWrite', 'DataplaneDelete', "
            "'ListReferrers' or 'OAuth'",
        ),
        (
            "{category: OAuth, scope: ip, ratePerMinute: 1, burst: 1}",
            "scope: Input should be 'registry' or 'identity'",
        ),
        ("{category: OAuth, scope: registry, burst: 1}", "ratePerMinute: required"),
        ("{category: OAuth, scope: registry, ratePerMinute: 1}", "burst: required"),
        ("{scope: registry, ratePerMinute: 1, burst: 1}", "category: required"),
        (
            "{category: OAuth, scope: registry, ratePerMinute: 1, burst: 1, window: 1m}",
            "window: unknown key",
        ),
    ],
)
def test_bucket_validation(bucket: str, error: str) -> None:
    """Each bucket field is checked, the error naming the bucket's index and field."""
    assert bucket_error(bucket) == [f"registries.r.example.quota.buckets[0].{error}"]


def test_duplicate_buckets() -> None:
    """Two explicit buckets of one category and scope are an error at the second one."""
    errors = errors_of(
        """
registries:
  r.example:
    quota:
      buckets:
        - {category: OAuth, scope: registry, ratePerMinute: 1, burst: 1}
        - {category: OAuth, scope: identity, ratePerMinute: 1, burst: 1}
        - {category: OAuth, scope: registry, ratePerMinute: 2, burst: 1}
"""
    )
    assert errors == [
        "registries.r.example.quota.buckets[2]: duplicate bucket OAuth/registry (also buckets[0])"
    ]


@pytest.mark.parametrize(
    ("quota", "error"),
    [
        (
            "{preset: acr-gold}",
            "registries.r.example.quota.preset: Input should be 'acr-basic', 'acr-standard', "
            "'acr-premium', 'dockerhub-anonymous' or 'dockerhub-authenticated'",
        ),
        ("acr-basic", "registries.r.example.quota: must be a mapping, not a string"),
        (
            "{buckets: {category: OAuth}}",
            "registries.r.example.quota.buckets: must be a list, not a mapping",
        ),
        ("{presets: [acr-basic]}", "registries.r.example.quota.presets: unknown key"),
    ],
)
def test_quota_block_validation(quota: str, error: str) -> None:
    """The quota block itself: known presets, a mapping, a list of buckets, no unknown keys."""
    assert errors_of(f"registries: {{r.example: {{quota: {quota}}}}}") == [error]


def test_default_quota_errors_name_the_default_block() -> None:
    """An invalid quota in default is reported once, at registries.default."""
    assert errors_of(
        "registries:\n  default: {quota: {preset: acr}}\n  ghcr.io: {}\n  quay.io: {}\n"
    ) == [
        "registries.default.quota.preset: Input should be 'acr-basic', 'acr-standard', "
        "'acr-premium', 'dockerhub-anonymous' or 'dockerhub-authenticated'"
    ]


def test_python_errors_name_their_paths() -> None:
    """Built from Python, a duplicate is a ValidationError naming the bucket."""
    bucket = QuotaBucket("OAuth", "registry", 1.0, 1)
    with pytest.raises(ValidationError, match=r"buckets\[1\]: duplicate bucket OAuth/registry"):
        QuotaSettings(buckets=(bucket, bucket))


# --- check-config -----------------------------------------------------------------------------


def test_describe_shows_each_hosts_quota() -> None:
    """check-config prints every host's effective buckets, marking the explicit ones."""
    text = describe(
        parse_config(
            """
registries:
  docker.io: {quota: {preset: dockerhub-anonymous}}
  r.azurecr.io:
    quota:
      preset: acr-basic
      buckets: [{category: OAuth, scope: identity, ratePerMinute: 12.5, burst: 3}]
  plain.example: {}
"""
        )
    )
    assert (
        "\ndocker.io\n" in text
        and "  quota: preset dockerhub-anonymous "
        "(manifest GETs per identity, limit read from ratelimit headers)\n"
        in text
    )
    azure = text.split("\nr.azurecr.io\n")[1].split("\n\n")[0]
    assert (
        "  quota: preset acr-basic\n"
        "    DataplaneRead per registry: 10000/min, burst 167\n"
        "    DataplaneRead per identity: 5000/min, burst 84\n"
        "    DataplaneWrite per registry: 2000/min, burst 34\n"
        "    DataplaneWrite per identity: 1000/min, burst 17\n"
        "    DataplaneDelete per registry: 1000/min, burst 17\n"
        "    DataplaneDelete per identity: 500/min, burst 9\n"
        "    ListReferrers per registry: 500/min, burst 9\n"
        "    ListReferrers per identity: 250/min, burst 5\n"
        "    OAuth per registry: 10000/min, burst 167\n"
        "    OAuth per identity: 12.5/min, burst 3 (explicit)" in azure
    )
    plain = text.split("\nplain.example\n")[1].split("\n\n")[0]
    assert "  quota: none\n" in plain
    only_buckets = describe(
        parse_config(
            "registries: {default: {quota: {buckets: "
            "[{category: OAuth, scope: registry, ratePerMinute: 6, burst: 1}]}}}"
        )
    )
    assert "  quota: no preset\n    OAuth per registry: 6/min, burst 1 (explicit)\n" in only_buckets


@pytest.mark.parametrize(
    ("block", "shown", "warned"),
    [
        # Docker Hub anonymous: 100 pulls per 6h, copies only (HEAD checks are free)
        ("quota: {preset: dockerhub-anonymous}", "quota allows 16.7/h", False),
        ("copy: {interval: 1m}\n    quota: {preset: dockerhub-anonymous}", "60 copies/h", True),
        (
            "copy: {interval: 3m}\n    quota: {preset: dockerhub-authenticated}",
            "20 copies/h",
            False,
        ),
        ("copy: {interval: 1m}\n    quota: {preset: dockerhub-authenticated}", "33.3/h", True),
        (
            "check: {interval: 1s}\n    quota: {preset: dockerhub-anonymous}",
            "3,600 checks/h",
            False,
        ),
        # ACR: every read counts, checks and copies alike
        ("quota: {preset: acr-basic}", "quota allows 600,000/h", False),
        ("check: {interval: 1s}\n    quota: {preset: acr-basic, share: 0.001}", "600/h", True),
        ("{}", "a first pull waits up to 6m0s", False),
    ],
)
def test_check_config_prints_each_hosts_rates_beside_its_quota(
    block: str, shown: str, warned: bool
) -> None:
    """check-config says what a host's intervals let through an hour (and how long a first
    pull may wait) beside what its quota preset allows, and warns when they let through more
    (§14)."""
    text = describe(parse_config(f"registries:\n  r.example:\n    {block}\n"))
    host = text.split("\nr.example\n")[1].split("\n\n")[0]
    assert shown in host
    assert ("WARNING" in host) is warned
