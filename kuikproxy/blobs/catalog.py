"""Who may be given which blob (grants), and the tags last read for manifests, in memory.

Both are bounded, oldest out (a grant given again, a tag read again, is new again): clients can
make as many owner keys and tags as they like, the memory cannot. Losing one costs a read
upstream, never a leak: the store serves a blob only to an owner it was granted to (R5). Both
go with their blob: the store calls :meth:`Catalog.drop` when it evicts one. Every change is
recorded by key for the index, which :meth:`Catalog.take` hands over.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

from kuikproxy.blobs.index import GrantKey, TagKey, tag_key
from kuikproxy.blobs.records import TagRecord

Place = tuple[str, str, str]  # host, repository, digest or tag
K = TypeVar("K")
V = TypeVar("V")


class Catalog:
    def __init__(
        self,
        max_grants: int,
        max_tags: int,
        grants: list[tuple[GrantKey, int]],
        tags: list[tuple[TagRecord, int]],
    ) -> None:
        self._max_grants = max_grants
        self._max_tags = max_tags
        self._grants: OrderedDict[GrantKey, None] = OrderedDict()  # oldest first
        self._owners: dict[Place, set[str | None]] = {}  # (host, repository, digest) → owners
        self._grants_of: dict[str, set[GrantKey]] = {}  # digest → its grants
        self._tags: OrderedDict[TagKey, TagRecord] = OrderedDict()  # oldest first
        self._named: dict[Place, dict[str | None, TagRecord]] = {}  # (host, repo, tag) → owner →
        self._tags_of: dict[str, set[TagKey]] = {}  # digest → tags naming it
        self._grant_changes: dict[GrantKey, int | None] = {}
        self._tag_changes: dict[TagKey, tuple[TagRecord, int] | None] = {}
        # one sequence orders both, across restarts: the index loads each oldest first by it
        self._seq = max((seq for _, seq in (*grants, *tags)), default=0)
        for key, _ in grants:
            self._add_grant(key)
        for record, _ in tags:
            self._add_tag(record)
        self._bound()  # the bounds may be lower than at the last run
        self.take()  # loading is no change

    def grant(self, host: str, repository: str, digest: str, owner: str | None) -> None:
        key = (host, repository, digest, owner)
        if key in self._grants:
            self._grants.move_to_end(key)
        else:
            self._add_grant(key)
        self._seq += 1
        self._grant_changes[key] = self._seq
        self._bound()

    def __len__(self) -> int:
        """Grants and tags held (``cache.blobs.maxEntries`` bounds them together)."""
        return len(self._grants) + len(self._tags)

    def owners(self, host: str, repository: str, digest: str) -> frozenset[str | None]:
        return frozenset(self._owners.get((host, repository, digest), ()))

    def tag(self, record: TagRecord) -> None:
        key = tag_key(record)
        if key in self._tags:
            self._drop_tag(key)
        self._add_tag(record)
        self._seq += 1
        self._tag_changes[key] = (record, self._seq)
        self._bound()

    def tags(self, host: str, repository: str, tag: str) -> list[TagRecord]:
        records = self._named.get((host, repository, tag), {}).values()
        return sorted(records, key=lambda record: record.read_at, reverse=True)

    def all_tags(self) -> list[TagRecord]:
        return list(self._tags.values())

    def drop(self, digest: str) -> None:
        """Forget the grants and tags of a blob that is gone."""
        for grant in self._grants_of.get(digest, set()).copy():
            self._drop_grant(grant)
        for key in self._tags_of.get(digest, set()).copy():
            self._drop_tag(key)

    def take(self) -> tuple[dict[GrantKey, int | None], dict[TagKey, tuple[TagRecord, int] | None]]:
        """The changes since the last call, for the index."""
        taken = self._grant_changes, self._tag_changes
        self._grant_changes, self._tag_changes = {}, {}
        return taken

    def _bound(self) -> None:
        while len(self._grants) > self._max_grants:
            self._drop_grant(next(iter(self._grants)))
        while len(self._tags) > self._max_tags:
            self._drop_tag(next(iter(self._tags)))

    def _add_grant(self, key: GrantKey) -> None:
        host, repository, digest, owner = key
        self._grants[key] = None
        self._owners.setdefault((host, repository, digest), set()).add(owner)
        self._grants_of.setdefault(digest, set()).add(key)

    def _drop_grant(self, key: GrantKey) -> None:
        host, repository, digest, owner = key
        del self._grants[key]
        _discard(self._owners, (host, repository, digest), owner)
        _discard(self._grants_of, digest, key)
        self._grant_changes[key] = None

    def _add_tag(self, record: TagRecord) -> None:
        key = tag_key(record)
        self._tags[key] = record
        self._named.setdefault(key[:3], {})[record.owner] = record
        self._tags_of.setdefault(record.digest, set()).add(key)

    def _drop_tag(self, key: TagKey) -> None:
        record = self._tags.pop(key)
        named = self._named[key[:3]]
        del named[record.owner]
        if not named:
            del self._named[key[:3]]
        _discard(self._tags_of, record.digest, key)
        self._tag_changes[key] = None


def _discard(index: dict[K, set[V]], key: K, value: V) -> None:
    """Take ``value`` out of ``index[key]``, and the key out when nothing is left under it."""
    values = index[key]
    values.discard(value)
    if not values:
        del index[key]
