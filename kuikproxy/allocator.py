"""The C allocator told to give memory back to the system, where it is glibc's.

Blob relays come and go in buffers of up to a MiB (rings, stream buffers, fan-out windows).
glibc's malloc keeps what they freed unless told otherwise: left alone it raises its mapping
threshold to the size of each large block freed (up to 32 MiB), so that the next relays' buffers
come from the heap, which a block still in use near its top cannot shrink — measured, 200 slow
readers' relays left ~340 MiB in the process after they had all gone. So the threshold is fixed
at start (:func:`keep_large_blocks_mapped`), and once no relay holds memory the heap is trimmed
(:func:`trim`). Elsewhere (musl, macOS) both do nothing: those allocators return large blocks.

A fixed threshold has a price where a block above it is made for every read: asyncio reads a
connection into a new ``bytes`` of its transport's ``max_size`` (256 KiB), then shrinks it to
what came, so each read of a client's request was a mapping made, touched and unmade —
measured, half the kept answers' throughput. A client's requests are small: its connection
reads pieces of :data:`CLIENT_READ`, from the heap (:func:`read_small`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

MMAP_THRESHOLD = 128 * 1024  # bytes from which a block gets a mapping of its own
CLIENT_READ = 64 * 1024  # bytes a client's connection is read in at most, under MMAP_THRESHOLD
_M_MMAP_THRESHOLD = -3  # mallopt(3)'s parameter number (glibc's malloc.h)


def _glibc() -> Any | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc's own: absent elsewhere)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_LIBC = _glibc()


def keep_large_blocks_mapped() -> None:
    """Every block of :data:`MMAP_THRESHOLD` bytes or more mapped on its own, given back to
    the system when freed (setting the threshold also stops glibc from raising it)."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def trim() -> None:
    """Give the heap's free memory back to the system (``malloc_trim(0)``: a walk of the
    heap's free blocks, well under a millisecond for kuikproxy's)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def read_small(transport: Any) -> None:
    """``transport`` reads at most :data:`CLIENT_READ` bytes at a time: a buffer the heap gives
    and takes back, never a mapping of its own. Duck-typed: asyncio's selector transports have
    ``max_size``; others (uvloop's, a test's) are left as they are."""
    if getattr(transport, "max_size", 0) > CLIENT_READ:
        transport.max_size = CLIENT_READ
