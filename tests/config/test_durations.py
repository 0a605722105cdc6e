"""Go-style durations and byte sizes (kuikproxy.durations)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kuikproxy.durations import format_duration, parse_duration, parse_size

# (text, seconds) pairs checked against Go's time.ParseDuration.
PARSE_CASES = [
    ("0", 0.0),
    ("0s", 0.0),
    ("5s", 5.0),
    ("30s", 30.0),
    ("1478s", 1478.0),
    ("+5s", 5.0),
    ("5.0s", 5.0),
    ("5.6s", 5.6),
    ("5.s", 5.0),
    (".5s", 0.5),
    ("1.004s", 1.004),
    ("1.0040s", 1.004),
    ("100.00100s", 100.001),
    ("250ms", 0.25),
    ("10ns", 10e-9),
    ("11us", 11e-6),
    ("12µs", 12e-6),  # U+00B5 MICRO SIGN
    ("12μs", 12e-6),  # U+03BC GREEK SMALL LETTER MU
    ("13ms", 0.013),
    ("1m", 60.0),
    ("1h", 3600.0),
    ("1h30m", 5400.0),
    ("1.5h", 5400.0),
    ("3h30m", 12600.0),
    ("10.5s4m", 250.5),
    ("1m1.5s", 61.5),
    ("2h45m30.5s", 9930.5),
    ("1h1m1s1ms1us1ns", 3661.001001001),
    ("39h9m14.425s", 140954.425),
    ("52763797000ns", 52.763797),
]


@pytest.mark.parametrize(("text", "seconds"), PARSE_CASES)
def test_parse_go_strings(text: str, seconds: float) -> None:
    """Go duration strings parse to the same value as time.ParseDuration gives."""
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(0, 0.0), (30, 30.0), (1.5, 1.5), ("30", 30.0), ("1.5", 1.5), (" 10s ", 10.0)],
)
def test_parse_plain_numbers_are_seconds(value: str | float, seconds: float) -> None:
    """Numbers, and strings holding only a number, are seconds (``timeout: 0``)."""
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "text", ["", " ", "1x", "s", ".", ".s", "1.2.3s", "1s2", "1 s", "1d", "1S", "inf", "x1s"]
)
def test_parse_rejects_invalid(text: str) -> None:
    """Anything Go would not parse is a ValueError naming the value."""
    with pytest.raises(ValueError, match=r'^invalid duration "'):
        parse_duration(text)


def test_parse_error_message_is_exact() -> None:
    """The message is the one SPEC §7 quotes: ``invalid duration "1x"``."""
    with pytest.raises(ValueError) as caught:
        parse_duration("1x")
    assert str(caught.value) == 'invalid duration "1x"'


@pytest.mark.parametrize("value", ["-1s", "-0.5", -1, -0.1, "-1h30m"])
def test_parse_rejects_negative(value: str | float) -> None:
    """Negative durations have no meaning in a config and are refused."""
    with pytest.raises(ValueError, match="negative"):
        parse_duration(value)


@pytest.mark.parametrize("value", [True, False, float("nan"), float("inf")])
def test_parse_rejects_non_durations(value: float) -> None:
    """Booleans (``timeout: yes``) and non-finite numbers are not durations."""
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(value)


def test_parse_rejects_beyond_go_range() -> None:
    """Go's Duration is int64 nanoseconds; more than that is an error, as in Go."""
    with pytest.raises(ValueError, match="too large"):
        parse_duration("9223372036854775808ns")
    assert parse_duration("2562047h") == 2562047 * 3600.0


# (seconds, text) pairs checked against Go's time.Duration.String().
FORMAT_CASES = [
    (0.0, "0s"),
    (1e-9, "1ns"),
    (1.1e-6, "1.1µs"),
    (2.2e-3, "2.2ms"),
    (0.25, "250ms"),
    (1.5, "1.5s"),
    (3.3, "3.3s"),
    (30.0, "30s"),
    (60.0, "1m0s"),
    (300.0, "5m0s"),
    (61.5, "1m1.5s"),
    (4 * 60 + 5.001, "4m5.001s"),
    (3600.0, "1h0m0s"),
    (5400.0, "1h30m0s"),
    (86400.0, "24h0m0s"),
    (9930.5, "2h45m30.5s"),
    (5 * 3600 + 6 * 60 + 7.001, "5h6m7.001s"),
    (8 * 3600 + 60 + 1e-9, "8h1m0.000000001s"),
    (-1.5, "-1.5s"),
]


@pytest.mark.parametrize(("seconds", "text"), FORMAT_CASES)
def test_format_like_go(seconds: float, text: str) -> None:
    """Formatting matches Go's time.Duration.String() character for character."""
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**15))
def test_round_trip_from_nanoseconds(ns: int) -> None:
    """Any whole-nanosecond duration survives format → parse → format unchanged."""
    text = format_duration(ns / 1e9)
    assert round(parse_duration(text) * 1e9) == ns
    assert format_duration(parse_duration(text)) == text


@given(
    st.integers(min_value=0, max_value=1000),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=999),
)
def test_round_trip_from_components(hours: int, minutes: int, seconds: int, millis: int) -> None:
    """Text written as h/m/s/ms components parses to their sum, and prints back canonically."""
    text = f"{hours}h{minutes}m{seconds}s{millis}ms"
    total = hours * 3600 + minutes * 60 + seconds + millis / 1000
    assert parse_duration(text) == pytest.approx(total, abs=1e-9)
    assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (100, 100),
        ("100", 100),
        ("10Ki", 10 * 1024),
        ("256Mi", 256 * 1024**2),
        ("1Gi", 1024**3),
        ("2Ti", 2 * 1024**4),
        ("5M", 5_000_000),
        ("5k", 5000),
        ("5K", 5000),
        ("1G", 10**9),
        ("1.5Ki", 1536),
        ("0", 0),
    ],
)
def test_parse_size(value: str | int, size: int) -> None:
    """Sizes take Kubernetes-style binary (Ki) and decimal (k, M) suffixes, or plain bytes."""
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["", "1x", "Mi", "-1", "1.5", "1 MiB", "1mi", -5, "0.1Ki"])
def test_parse_size_rejects(value: str | int) -> None:
    """Unknown suffixes, negatives and fractions of a byte are refused."""
    with pytest.raises(ValueError, match=r'^invalid size "'):
        parse_size(value)
