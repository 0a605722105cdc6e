"""SPEC §11's presets and request categories, and an ACR preset scaled down to a timeline
where one identity's bucket throttles it while another identity keeps flowing."""

from __future__ import annotations

import pytest

from kuikproxy.core.quota import (
    PRESETS,
    BucketSpec,
    Category,
    HostQuota,
    Route,
    Scope,
    categories_of,
    preset,
)

C = Category
REG, IDN = Scope.REGISTRY, Scope.IDENTITY


def rates(name: str) -> dict[tuple[Category, Scope], float | None]:
    return {(s.category, s.scope): s.rate_per_minute for s in preset(name)}


def test_acr_basic_and_standard_numbers() -> None:
    """acr-basic and acr-standard: read 10000/5000, write 2000/1000, delete 1000/500,
    referrers 500/250 (registry/identity), OAuth 10000 per registry only."""
    expected = {
        (C.DATAPLANE_READ, REG): 10000,
        (C.DATAPLANE_READ, IDN): 5000,
        (C.DATAPLANE_WRITE, REG): 2000,
        (C.DATAPLANE_WRITE, IDN): 1000,
        (C.DATAPLANE_DELETE, REG): 1000,
        (C.DATAPLANE_DELETE, IDN): 500,
        (C.LIST_REFERRERS, REG): 500,
        (C.LIST_REFERRERS, IDN): 250,
        (C.OAUTH, REG): 10000,
    }
    assert rates("acr-basic") == expected
    assert rates("acr-standard") == expected


def test_acr_premium_numbers() -> None:
    """acr-premium: 20000/10000, 4000/2000, 4000/2000, 2000/1000, OAuth 20000."""
    assert rates("acr-premium") == {
        (C.DATAPLANE_READ, REG): 20000,
        (C.DATAPLANE_READ, IDN): 10000,
        (C.DATAPLANE_WRITE, REG): 4000,
        (C.DATAPLANE_WRITE, IDN): 2000,
        (C.DATAPLANE_DELETE, REG): 4000,
        (C.DATAPLANE_DELETE, IDN): 2000,
        (C.LIST_REFERRERS, REG): 2000,
        (C.LIST_REFERRERS, IDN): 1000,
        (C.OAUTH, REG): 20000,
    }


def test_preset_bursts_are_one_seconds_worth() -> None:
    """Every ACR bucket's burst is one second's worth of its rate, rounded up."""
    bursts = {(s.category, s.scope): s.burst for s in preset("acr-standard")}
    assert bursts[(C.DATAPLANE_READ, REG)] == 167
    assert bursts[(C.DATAPLANE_READ, IDN)] == 84
    assert bursts[(C.LIST_REFERRERS, IDN)] == 5
    assert bursts[(C.OAUTH, REG)] == 167


def test_dockerhub_presets_learn_manifest_gets_per_identity() -> None:
    """Docker Hub: one learnt (rate-less) manifest-GET bucket per identity."""
    for name in ("dockerhub-anonymous", "dockerhub-authenticated"):
        (spec,) = preset(name)
        assert (spec.category, spec.scope, spec.learnt) == (C.MANIFEST_GET, IDN, True)
        assert spec.rate_per_minute is None and spec.burst is None


def test_unknown_preset_and_bad_scale() -> None:
    """An unknown name lists the known ones; a scale must be positive."""
    with pytest.raises(ValueError, match="acr-premium"):
        preset("acr-free")
    with pytest.raises(ValueError):
        preset("acr-basic", scale=0)
    assert set(PRESETS) == {
        "acr-basic",
        "acr-standard",
        "acr-premium",
        "dockerhub-anonymous",
        "dockerhub-authenticated",
    }


def test_scaled_preset_recomputes_bursts() -> None:
    """Scaling multiplies fixed rates and recomputes bursts; learnt buckets stay learnt."""
    scaled = {
        (s.category, s.scope): (s.rate_per_minute, s.burst)
        for s in preset("acr-basic", scale=0.001)
    }
    assert scaled[(C.DATAPLANE_READ, REG)] == pytest.approx((10.0, 1.0))
    assert scaled[(C.DATAPLANE_READ, IDN)] == pytest.approx((5.0, 1.0))
    assert preset("dockerhub-anonymous", scale=0.5) == preset("dockerhub-anonymous")


@pytest.mark.parametrize(
    ("method", "route", "expected"),
    [
        ("GET", Route.MANIFESTS, {C.DATAPLANE_READ, C.MANIFEST_GET}),
        ("HEAD", Route.MANIFESTS, {C.DATAPLANE_READ}),
        ("get", Route.BLOBS, {C.DATAPLANE_READ}),
        ("GET", Route.TAGS, {C.DATAPLANE_READ}),
        ("OPTIONS", Route.PING, {C.DATAPLANE_READ}),
        ("GET", Route.REFERRERS, {C.LIST_REFERRERS, C.DATAPLANE_READ}),
        ("HEAD", Route.REFERRERS, {C.DATAPLANE_READ}),
        ("PUT", Route.MANIFESTS, {C.DATAPLANE_WRITE}),
        ("PATCH", Route.BLOBS, {C.DATAPLANE_WRITE}),
        ("POST", Route.BLOBS, {C.DATAPLANE_WRITE}),
        ("DELETE", Route.MANIFESTS, {C.DATAPLANE_DELETE}),
        ("GET", Route.TOKEN, {C.OAUTH}),
        ("POST", Route.TOKEN, {C.OAUTH}),
        ("TRACE", Route.OTHER, set()),
    ],
)
def test_categories_of_requests(method: str, route: Route, expected: set[Category]) -> None:
    """Categories follow the method; referrers GETs add ListReferrers, manifest GETs Docker
    Hub's ManifestGet; token requests are OAuth alone."""
    assert categories_of(method, route) == expected
    assert categories_of(method, route, by_digest=True) == expected


def test_scaled_acr_throttles_one_identity_while_another_flows() -> None:
    """acr-basic ÷ 1000: reads 10 r/m per registry, 5 r/m per identity (bursts 1). Identity A
    asks every 6 s and gets one read in two — its own bucket holds it to one per 12 s, and says
    so (6 s more); B asks every other time, right after A's refusals, and is never held back:
    together they use the registry's 10 a minute, and neither waits on the other."""
    quota = HostQuota(preset("acr-basic", scale=0.001))
    read = categories_of("GET", Route.MANIFESTS)
    a_ok = b_ok = 0
    for step in range(10):
        now = step * 6.0
        wait = quota.take(read, "user:a", now)
        if wait == 0.0:
            a_ok += 1
        else:
            assert wait == pytest.approx(6.0)  # A's own bucket: half full at 5 r/m
        if step % 2 == 1:
            assert wait > 0  # A was refused at this very moment …
            assert quota.take(read, "user:b", now) == 0.0  # … and B goes
            b_ok += 1
    assert (a_ok, b_ok) == (5, 5)
    # the registry bucket is the one both drained: a third identity waits on it
    assert quota.take(read, "user:c", 54.0) == pytest.approx(6.0)


def test_scaled_acr_identity_bucket_refuses_before_registry_bucket() -> None:
    """The same preset with more headroom: A alone drains its identity bucket, and the
    registry bucket still has room for B at that very moment."""
    specs = [
        BucketSpec(C.DATAPLANE_READ, REG, 600.0),  # burst 10
        BucketSpec(C.DATAPLANE_READ, IDN, 300.0),  # burst 5
    ]
    quota = HostQuota(specs)
    read = [C.DATAPLANE_READ]
    assert [quota.take(read, "a", 0.0) for _ in range(5)] == [0.0] * 5
    assert quota.take(read, "a", 0.0) == pytest.approx(0.2)  # its own 300 r/m
    assert [quota.take(read, "b", 0.0) for _ in range(5)] == [0.0] * 5
    assert quota.take(read, "c", 0.0) == pytest.approx(0.1)  # now the registry's 600 r/m
