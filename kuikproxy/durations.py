"""Go-style durations and Kubernetes-style byte sizes, as written in the config (SPEC §7).

Durations are parsed the way Go's ``time.ParseDuration`` parses them (kuik's config is Go, and
operators copy values between the two), and printed the way ``time.Duration.String()`` prints
them, so ``check-config`` shows ``1m0s`` where kuik would. Internally a duration is a ``float`` of
seconds; the text forms go through whole nanoseconds, as Go's do, so nothing drifts on a round
trip.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["format_duration", "parse_duration", "parse_size"]

_NS_PER_UNIT: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN, the one Go prints
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU, which Go accepts too
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}

# One component of a Go duration: digits with an optional fraction ("1", "1.5", ".5", "1."),
# then a unit. The unit is matched loosely here and checked against the table, so "1x" is
# reported as an invalid duration rather than silently split.
_COMPONENT = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]+)")
# A bare number is seconds (YAML authors write ``timeout: 0`` or ``"30"``).
_PLAIN_NUMBER = re.compile(r"\+?(?:\d+(?:\.\d*)?|\.\d+)")
# Go's Duration is an int64 of nanoseconds; larger values are an error there, so here too.
_MAX_NS = 2**63 - 1


def _invalid(value: object, why: str = "") -> ValueError:
    text = f'invalid duration "{value}"'
    return ValueError(f"{text}: {why}" if why else text)


def _parse_ns(text: str) -> int:
    """Whole nanoseconds of a Go duration string or a plain number of seconds."""
    original = text
    text = text.strip()
    if text.startswith("-"):
        # Go accepts "-1s"; a negative interval or timeout has no meaning in a config.
        raise _invalid(original, "must not be negative")
    if _PLAIN_NUMBER.fullmatch(text):
        return _seconds_to_ns(Fraction(text.lstrip("+")), original)
    if text.startswith("+"):
        text = text[1:]
    if not text:
        raise _invalid(original)
    total = Fraction(0)
    pos = 0
    while pos < len(text):
        match = _COMPONENT.match(text, pos)
        if match is None:
            raise _invalid(original)
        whole, frac, unit = match.groups()
        # Go requires at least one digit around the point: "." and ".s" are invalid.
        if not whole and not frac:
            raise _invalid(original)
        scale = _NS_PER_UNIT.get(unit)
        if scale is None:
            raise _invalid(original)
        number = Fraction(int(whole or "0"))
        if frac:
            number += Fraction(int(frac), 10 ** len(frac))
        total += number * scale
        pos = match.end()
    # Go truncates sub-nanosecond fractions ("1.5ns" is 1ns).
    ns = math.floor(total)
    if ns > _MAX_NS:
        raise _invalid(original, "too large")
    return ns


def _seconds_to_ns(seconds: Fraction, original: object) -> int:
    if seconds < 0:
        raise _invalid(original, "must not be negative")
    ns = round(seconds * 1_000_000_000)
    if ns > _MAX_NS:
        raise _invalid(original, "too large")
    return ns


def parse_duration(value: str | int | float) -> float:
    """Seconds of a duration: a Go-style string (``"1h30m"``) or a number of seconds.

    Raises ``ValueError`` (``invalid duration "1x"``) for anything else, for negative values and
    for values beyond Go's range (about 292 years).
    """
    # bool is an int subclass; ``timeout: true`` is a mistake, not one second.
    if isinstance(value, bool):
        raise _invalid(value)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise _invalid(value)
        return _seconds_to_ns(Fraction(value), value) / 1_000_000_000
    if isinstance(value, str):
        return _parse_ns(value) / 1_000_000_000
    raise _invalid(value)


def _frac_digits(value: int, precision: int) -> tuple[str, int]:
    """Go's ``fmtFrac``: the fraction of ``value / 10**precision`` without trailing zeros."""
    scale = 10**precision
    digits = str(value % scale).rjust(precision, "0").rstrip("0")
    return ("." + digits if digits else ""), value // scale


def format_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String()`` prints it: ``1m0s``, ``250ms``, ``0s``."""
    # Through Fraction so that a float of seconds maps to the nanosecond it was parsed from.
    ns = round(Fraction(seconds) * 1_000_000_000)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        # Below one second Go switches to the largest unit that keeps an integer part.
        if ns < 1_000:
            unit, precision = "ns", 0
        elif ns < 1_000_000:
            unit, precision = "\u00b5s", 3
        else:
            unit, precision = "ms", 6
        frac, whole = _frac_digits(ns, precision)
        return f"{sign}{whole}{frac}{unit}"
    frac, whole_seconds = _frac_digits(ns, 9)
    minutes, secs = divmod(whole_seconds, 60)
    text = f"{secs}{frac}s"
    if minutes:
        hours, minutes = divmod(minutes, 60)
        text = f"{minutes}m{text}"
        if hours:
            text = f"{hours}h{text}"
    return sign + text


_SIZE_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "E": 1000**6,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
}
# Kubernetes quantity spelling (what kuik users already write for memory limits).
_SIZE = re.compile(r"\+?(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)")


def human_span(seconds: float) -> str:
    """A short duration for people: ``0.2s``, ``12.5s``, ``3m05s``, ``2h04m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def parse_size(value: str | int) -> int:
    """Bytes of a size: an integer or a string like ``"256Mi"``, ``"1Gi"``, ``"5M"``, ``"100"``.

    Binary suffixes (``Ki`` … ``Ei``) are powers of 1024, decimal ones (``k``/``K`` … ``E``)
    powers of 1000. A fractional value must come out as whole bytes (``"1.5Ki"`` is 1536).
    Raises ``ValueError`` (``invalid size "x"``) otherwise.
    """
    if isinstance(value, bool):
        raise ValueError(f'invalid size "{value}"')
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f'invalid size "{value}": must not be negative')
        return value
    if not isinstance(value, str):
        raise ValueError(f'invalid size "{value}"')
    match = _SIZE.fullmatch(value.strip())
    if match is None or match.group(2) not in _SIZE_SUFFIXES:
        raise ValueError(f'invalid size "{value}"')
    size = Fraction(match.group(1)) * _SIZE_SUFFIXES[match.group(2)]
    if size.denominator != 1:
        raise ValueError(f'invalid size "{value}": not a whole number of bytes')
    return int(size)
