"""``fleet.redis``: one server, a Redis Cluster or Sentinel's master — which keys go together,
the messages for those that do not, and what ``check-config`` says of the fleet."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kuikproxy.cli import main
from kuikproxy.config.loading import parse_config
from tests.config.test_config_loading import errors_of


def redis(text: str) -> str:
    return f"fleet: {{redis: {{{text}}}, name: p0}}\n"


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("url: redis://r:6379/0", "single"),
        ("url: rediss://r:6379, cluster: true", "cluster"),
        ("sentinels: ['s1:26379', '[::1]:26380'], masterName: m", "sentinel"),
        ("sentinels: ['s1:26379'], masterName: m, tls: true, tlsCaFile: /ca", "sentinel"),
    ],
)
def test_each_kind_of_redis(text: str, mode: str) -> None:
    fleet = parse_config(redis(text), "test.yaml").fleet
    assert fleet is not None and fleet.redis.mode == mode


def test_sentinel_addresses_are_host_and_port() -> None:
    config = parse_config(redis("sentinels: ['s1:26379', '[::1]:26380'], masterName: m"), "t")
    fleet = config.fleet
    assert fleet is not None
    assert fleet.redis.sentinel_addresses() == (("s1", 26379), ("::1", 26380))


@pytest.mark.parametrize(
    ("text", "errors"),
    [
        ("", ["fleet.redis.url: required: a Redis URL, or sentinels and masterName"]),
        (
            "url: redis://r, sentinels: ['s:1'], masterName: m",
            ["fleet.redis.url: not with sentinels: the master is the one the Sentinels name"],
        ),
        ("sentinels: ['s:1']", ["fleet.redis.masterName: required with sentinels"]),
        (
            "sentinels: ['s:1'], masterName: m, cluster: true",
            ["fleet.redis.cluster: not with sentinels: Sentinel does not watch a Redis Cluster"],
        ),
        (
            "sentinels: ['s', 's:0', 's:26379'], masterName: m",
            [
                'fleet.redis.sentinels[0]: "s" is not host:port',
                'fleet.redis.sentinels[1]: "s:0" is not host:port',
            ],
        ),
        (
            "sentinels: ['s:1'], masterName: m, tlsCaFile: /ca",
            ["fleet.redis.tlsCaFile: needs tls: true"],
        ),
        ("url: redis://r, masterName: m", ["fleet.redis.masterName: only with sentinels"]),
        (
            "url: redis://r, sentinelPasswordFile: /p",
            ["fleet.redis.sentinelPasswordFile: only with sentinels"],
        ),
        (
            "url: redis://r, tls: true",
            ["fleet.redis.tls: only with sentinels: a URL turns TLS on by rediss://"],
        ),
        ("url: redis://r, tlsCaFile: /ca", ["fleet.redis.tlsCaFile: needs a rediss:// url"]),
        (
            "url: 'unix:///run/redis.sock', cluster: true",
            ["fleet.redis.url: a Redis Cluster is reached by redis:// or rediss://"],
        ),
    ],
)
def test_keys_that_do_not_go_together(text: str, errors: list[str]) -> None:
    assert errors_of(redis(text)) == errors


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "url: 'redis://:pw@r:6379/0', passwordFile: /p",
            "fleet: name p0, redis single, redis://:***@r:6379/0, passwordFile /p",
        ),
        (
            "url: 'rediss://r:7000', cluster: true, username: kuik, tlsCaFile: /ca",
            "fleet: name p0, redis cluster, rediss://r:7000, username kuik, tlsCaFile /ca",
        ),
        (
            "sentinels: ['s1:26379', 's2:26379'], masterName: m, sentinelPasswordFile: /s",
            "fleet: name p0, redis sentinel, master m of s1:26379, s2:26379, "
            "sentinelPasswordFile /s",
        ),
    ],
)
def test_check_config_shows_the_fleets_mode_never_a_password(
    text: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(redis(text))
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    lease = "a proxy's turns are its own two intervals past its last claim"
    assert f"\n{line}; cut off, it waits for it; {lease}\n" in out
    assert "pw" not in out


def test_check_config_without_a_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("cache: {maxAge: 1h}\n")
    assert main(["check-config", str(path)]) == 0
    assert "\nfleet: none (paced alone)\n" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_fleet_without_redis_py_installed_says_how_to_install_it(
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(redis("url: 'redis://r:6379/0'"))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    argv = (
        ["check-config", str(path)]
        if command == "check-config"
        else ["serve", "--config", str(path)]
    )
    assert main(argv) in {1, 2}
    err = capsys.readouterr().err
    assert "pip install 'kuikproxy[fleet]'" in err and "Traceback" not in err


def test_confirmed_claims_are_shown_and_refused_on_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(redis("sentinels: ['s1:26379'], masterName: m, confirmedBy: 1"))
    assert main(["check-config", str(path)]) == 0
    assert "a claim counts once 1 replica(s) hold it" in capsys.readouterr().out
    path.write_text(redis("url: 'redis://r:7000', cluster: true, confirmedBy: 1"))
    assert main(["check-config", str(path)]) == 1
    assert "confirmedBy" in capsys.readouterr().err
