"""What the kernel holds for a blob relay's two connections: their socket buffers, fixed.

A relay moves a blob from the registry's connection to its client's. Left to TCP's autotuning,
each grows its buffers to what the link seems to want — a send buffer up to ``tcp_wmem``'s
maximum (4 MiB), a receive buffer up to ``tcp_rmem``'s (6 MiB by default, 32 MiB on some
hosts) — and a slow client keeps them full for as long as it reads. That memory is not in the
process's RSS, but the pod's memory cgroup is charged for it: measured, 200 slow readers left
256 MiB in kuikproxy's send queues and 150 MiB in its receive queues, beside a 160 MiB RSS, in a
512 MiB pod. And a full send queue in front of each of them is work the loop did at once as
each relay started (relayed, decrypted, hashed): it lagged 130 ms.

So as a blob's body starts, both buffers are fixed (which also ends their autotuning): the
client's send buffer at :data:`SEND`, the registry's receive buffer at :data:`RECEIVE`; once
the relay's client has set its pace (:mod:`kuikproxy.runtime.pace`), the registry's at
:data:`RECEIVE_PACED`, which a slow client still never drains. Linux doubles the value set
(its bookkeeping), so a relay holds at most :func:`held` of each; the relays' room prices
them (:mod:`kuikproxy.runtime.relayroom`). :data:`RECEIVE` bounds a relay's throughput at
about twice itself per round trip to the registry: 1 MiB per 20 ms is 50 MB/s.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

SEND = 256 * 1024  # bytes asked for a relay's client's send buffer
RECEIVE = 512 * 1024  # bytes asked for the registry's receive buffer while the relay keeps up
RECEIVE_PACED = 64 * 1024  # bytes asked once its client sets the relay's pace


def held(asked: int) -> int:
    """What the kernel lets a buffer asked for ``asked`` bytes hold (socket(7): doubled)."""
    return 2 * asked


def fix_send(transport: Any) -> None:
    """The send buffer of a relay's client's connection, fixed at :data:`SEND`."""
    _fix(transport, socket.SO_SNDBUF, SEND)


def fix_receive(transport: Any, size: int) -> None:
    """The receive buffer of a relay's registry connection, fixed at ``size``."""
    _fix(transport, socket.SO_RCVBUF, size)


def _fix(transport: Any, option: int, size: int) -> None:
    # nothing when there is no socket (a test's transport) or it closed meanwhile
    raw = None if transport is None else transport.get_extra_info("socket")
    if raw is not None:
        with contextlib.suppress(OSError):
            raw.setsockopt(socket.SOL_SOCKET, option, size)
