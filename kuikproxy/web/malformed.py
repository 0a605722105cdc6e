"""Requests aiohttp's parser refused: answered with an OCI error body, counted by reason.

A request line, header block or body framing the parser refuses (or a version it parsed but no
HTTP/1.x) is the client's error, not kuikproxy's: aiohttp would log a traceback for each and
answer in plain text. Here it gets the OCI error body (§12) with the status RFC 9110/9112 gives
it, and ``Connection: close`` (the parser cannot find the next request after it); it is counted
under one of :data:`STATUSES`' reasons (``/status.clientErrors``,
``kuik_proxy_client_errors_total``) and warned of at most once a minute per reason, naming the
peer (:class:`~kuikproxy.errors.RefusalLog`). The reasons are a fixed set, so a flood of
malformed requests costs a counter each, never memory.

The reason is read from the parser's exception: its class where aiohttp gives one
(:class:`LineTooLong`, :class:`InvalidURLError`, :class:`BadHttpMethod`, the payload errors),
else the words of llhttp's reason, which aiohttp's C parser puts in a plain
:class:`BadHttpMessage` (``tests/web/test_malformed_http.py`` holds one request per reason, so
a release that words them otherwise is caught there).
"""

from __future__ import annotations

import traceback

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
)

from kuikproxy.errors import (
    BadRequest,
    HeadersTooLarge,
    RefusalLog,
    RegistryError,
    URITooLong,
    VersionNotSupported,
)
from kuikproxy.web.oci import error_response

LINE_TOO_LONG = "line-too-long"
HEADER_TOO_LARGE = "header-too-large"
BAD_HEADER = "bad-header"
BAD_FRAMING = "bad-framing"
BAD_PATH = "bad-path"
BAD_METHOD = "bad-method"
BAD_VERSION = "bad-version"
OTHER = "other"

STATUSES: dict[str, type[RegistryError]] = {
    LINE_TOO_LONG: URITooLong,
    HEADER_TOO_LARGE: HeadersTooLarge,
    BAD_HEADER: BadRequest,  # a line without a colon, a control character, no Host (§3.2)
    BAD_FRAMING: BadRequest,  # Content-Length with Transfer-Encoding, a bad chunk (§6.3)
    BAD_PATH: BadRequest,  # a NUL or another character no URI holds
    BAD_METHOD: BadRequest,  # TLS spoken to the plain port lands here
    BAD_VERSION: VersionNotSupported,
    OTHER: BadRequest,
}
"""Each reason, and the error it is answered with (one status a reason)."""

# llhttp's reasons for a version it will not take: HTTP/1.2, HTTP/1.x, HTTP/11.1, http/1.1,
# and HTTP/2's preface (PRI * HTTP/2.0)
_VERSION_WORDS = (
    "Invalid HTTP version",
    "Invalid major version",
    "Invalid minor version",
    "Expected dot",
    "Expected HTTP/",
    "Pause on PRI",
)
_FRAMING_WORDS = ("content-length", "transfer-encoding", "chunk")
_SHOWN = 200  # characters of the parser's reason a body or a log line shows


def reason_of(error: HttpProcessingError) -> str:
    """The reason aiohttp's parser refused a request with ``error``."""
    if isinstance(error, LineTooLong):
        return LINE_TOO_LONG if _in_target(error) else HEADER_TOO_LARGE
    if isinstance(error, InvalidURLError):
        return BAD_PATH
    if isinstance(error, BadHttpMethod):
        return BAD_METHOD
    text = error.message
    if any(words in text for words in _VERSION_WORDS):
        return BAD_VERSION
    lowered = text.lower()
    if isinstance(error, PayloadEncodingError) or any(w in lowered for w in _FRAMING_WORDS):
        return BAD_FRAMING  # before the headers': these are headers, read for the framing
    if "too many headers" in lowered or "too many trailers" in lowered:
        return HEADER_TOO_LARGE
    if isinstance(error, InvalidHeader) or "header" in lowered:
        return BAD_HEADER
    return OTHER


def _in_target(error: LineTooLong) -> bool:
    """Whether the line too long is the request target: llhttp's callback for it raised it
    (``cb_on_url``; a header's name or value is another callback's). aiohttp's pure-Python
    parser raises it from one place for every line: there it counts as a header's."""
    return any(
        frame.f_code.co_name.endswith("cb_on_url")
        for frame, _ in traceback.walk_tb(error.__traceback__)
    )


def answer(log: RefusalLog, reason: str, said: str, peer: str | None, now: float) -> web.Response:
    """The answer to a request from ``peer`` refused for ``reason`` (the parser ``said`` why),
    counted in ``log`` and warned of there at most once a minute per reason (``now``, loop
    time): ``a request refused (<reason>, <n> so far): malformed request from <peer>: …``."""
    # llhttp's reason is "what:\n\n  b'the line'\n      ^": on one line, its pointer left out
    shown = " ".join(w for line in said.splitlines() if (w := line.strip()) not in ("", "^"))
    message = f"malformed request from {peer or 'an unknown peer'}: {shown[:_SHOWN]}"
    error = log.count(reason, STATUSES[reason](message, detail={"reason": reason}), now)
    response = error_response(error)
    response.headers["Connection"] = "close"  # aiohttp writes none for its HTTP/1.0 answer
    response.force_close()
    return response
