"""The request lines a :class:`~kuikproxy.web.classify.Locator` remembers hold no copy of a
query they share with other lines (a held request pays for what its line holds)."""

from __future__ import annotations

from kuikproxy.config import parse_config
from kuikproxy.web.classify import Locator

CONFIG = parse_config("registries:\n  registry.test:\n    upstream: http://127.0.0.1:1\n")


def test_lines_with_one_query_share_it_and_read_as_before() -> None:
    locator = Locator(CONFIG)
    first = locator.locate("/v2/app/manifests/v1", "ns=registry.test", "proxy:80", False)
    second = locator.locate("/v2/app/manifests/v2", "ns=registry.test", "proxy:80", False)
    assert first.query == (("ns", "registry.test"),)
    assert second.query is first.query
    assert first.target.host == second.target.host == "registry.test"
    assert first.image is not None and first.image.reference == "v1"


def test_a_query_of_its_own_is_parsed_for_its_line() -> None:
    locator = Locator(CONFIG)
    line = locator.locate(
        "/v2/app/tags/list", "ns=registry.test&n=10&last=a%2Bb", "proxy:80", False
    )
    assert line.query == (("ns", "registry.test"), ("n", "10"), ("last", "a+b"))
    assert line.image is not None and line.image.query == "last=a%2Bb&n=10"
