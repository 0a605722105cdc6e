"""Copy queues and the open copy of a host (P9).

Copies drain queues rather than turn rings: each resource queues, in arrival order, the images
it still owes a host, and resources take the host's copy windows in turn. A window that takes a
copy *opens* it; the copy stays open while any of its requests is in flight and for
``copy.idle`` after the last one ends, or until ``copy.timeout``. While it is open the copy
series is busy, and the manifests by digest and blobs its members ask for in its repository
belong to it: they need no window of their own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


class CopyQueue:
    """The images one resource owes a host, oldest first, with how many requests wait on each."""

    __slots__ = ("_images",)

    def __init__(self) -> None:
        self._images: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._images)

    def __contains__(self, image: object) -> bool:
        return image in self._images

    def push(self, image: str) -> None:
        self._images[image] = self._images.get(image, 0) + 1

    def pop_request(self, image: str) -> None:
        """One waiting request for ``image`` left; the image leaves with the last one."""
        count = self._images.get(image, 0) - 1
        if count > 0:
            self._images[image] = count
        else:
            self._images.pop(image, None)

    def drop(self, image: str) -> None:
        self._images.pop(image, None)

    def first(self) -> str | None:
        return next(iter(self._images), None)


@dataclass(slots=True)
class OpenCopy:
    """The copy a host's copy series has open."""

    image: str
    repository: str
    opened_at: float
    members: set[str] = field(default_factory=set)  # resources whose requests belong to it
    in_flight: int = 0
    last_end: float | None = None

    def is_open(self, now: float, idle: float, timeout: float) -> bool:
        if timeout and now >= self.opened_at + timeout:
            return False
        if self.in_flight > 0:
            return True
        last = self.opened_at if self.last_end is None else self.last_end
        return now < last + idle

    def admits(
        self, resource: str, repository: str, now: float, idle: float, timeout: float
    ) -> bool:
        return (
            resource in self.members
            and repository == self.repository
            and self.is_open(now, idle, timeout)
        )
