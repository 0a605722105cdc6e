"""Every value is documented (``# --``), the chart README's table is current, the fully-set
values file sets every value, and the default config is one kuikproxy accepts."""

from __future__ import annotations

import yaml

from kuikproxy.config import parse_config
from tests.chart import CHART, full_values, helmdocs, render

# Values the tests set themselves, or that full values leave at their default on purpose.
SAME_AS_DEFAULT_OK = {
    "mode",  # each test picks the mode
    "serviceAccount.create",  # true, so its name and annotations are used
    "podDisruptionBudget.create",  # true, so minAvailable is used
    "store.enabled",  # true, so existingClaim is used
}


def test_every_value_is_documented() -> None:
    assert helmdocs.undocumented() == []
    for row in helmdocs.rows():
        assert row.description, row.key


def test_readme_table_is_current() -> None:
    """Regenerate it with ``python -m tests.chart.helmdocs --write``."""
    readme = (CHART / "README.md").read_text()
    assert helmdocs.readme_with_table(readme) == readme


def test_full_values_set_every_value() -> None:
    full = full_values()
    for row in helmdocs.rows():
        try:
            value = helmdocs.lookup(full, row.path)
        except KeyError:
            raise AssertionError(f"tests/chart/values-full.yaml does not set {row.key}") from None
        if row.key not in SAME_AS_DEFAULT_OK:
            assert value != row.default, f"values-full.yaml sets {row.key} to its default"
    # And nothing the chart does not have.
    documented = {row.path for row in helmdocs.rows()}
    for leaf in helmdocs.leaves(full):
        assert any(leaf[: len(path)] == path for path in documented), ".".join(leaf)


def test_default_config_is_the_embedded_default_pacing() -> None:
    """values.config spells out the embedded default's registries block, with ``serveStale``
    on (a shipped mirror, §15); rendered, it is the embedded default listening where the
    Service reaches it, with its state and its pull-through store on their volumes."""
    config = parse_config(render({}).one("ConfigMap")["data"]["config.yaml"])
    embedded = parse_config("registries: {default: {serveStale: true}}")
    assert config.registries == embedded.registries
    assert config.registry("docker.io").serve_stale is True
    assert config.allowed_hosts == embedded.allowed_hosts
    assert config.listen == "0.0.0.0:7439"
    assert config.state.path == "/var/lib/kuikproxy/state.db"
    assert config.cache.blobs.path == "/var/cache/kuikproxy/blobs"
    assert config.cache.blobs.max_bytes == embedded.cache.blobs.max_bytes
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["config"]) == {"registries"}
