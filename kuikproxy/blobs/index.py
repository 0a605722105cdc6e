"""The blob store's index: one SQLite file, used from one thread.

It holds what the files cannot say: each blob's media type and place in the LRU order, who may
be given it (grants), and the tags last read for manifests. It is a cache of a cache: the files
under ``blobs/`` are the truth (a file gets there only once verified), and the index may be
lost at no cost but a colder cache (:mod:`kuikproxy.blobs.recovery` makes the two agree at
open). So a file that is not this index (corrupt, someone else's, another schema version) is
deleted and started afresh rather than refused, and commits use ``synchronous=NORMAL``: in WAL
mode they survive the process being killed, and the last ones lost to a power cut are only
blobs the next open deletes, grants and tags to be read again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from dataclasses import dataclass, field

from kuikproxy.blobs.records import TagRecord

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_SCHEMA = (
    "CREATE TABLE blobs (digest TEXT PRIMARY KEY, size INTEGER NOT NULL, media_type TEXT,"
    " used INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE grants (host TEXT NOT NULL, repository TEXT NOT NULL, digest TEXT NOT NULL,"
    " owner TEXT NOT NULL, seq INTEGER NOT NULL,"
    " PRIMARY KEY (host, repository, digest, owner)) WITHOUT ROWID",
    "CREATE TABLE tags (host TEXT NOT NULL, repository TEXT NOT NULL, tag TEXT NOT NULL,"
    " owner TEXT NOT NULL, digest TEXT NOT NULL, media_type TEXT NOT NULL,"
    " read_at REAL NOT NULL, seq INTEGER NOT NULL,"
    " PRIMARY KEY (host, repository, tag, owner)) WITHOUT ROWID",
)

GrantKey = tuple[str, str, str, str | None]  # host, repository, digest, owner
TagKey = tuple[str, str, str, str | None]  # host, repository, tag, owner


@dataclass(frozen=True, slots=True)
class BlobRow:
    digest: str
    size: int
    media_type: str | None
    used: int  # its place in the LRU order: the higher, the more recently used


@dataclass(slots=True)
class Changes:
    """One transaction: the final state of every key that changed, None for gone. Keys, not a
    log of operations, so a blob evicted and stored again between two flushes is one row."""

    blobs: dict[str, BlobRow | None] = field(default_factory=dict)
    grants: dict[GrantKey, int | None] = field(default_factory=dict)  # → seq
    tags: dict[TagKey, tuple[TagRecord, int] | None] = field(default_factory=dict)  # → seq

    def __bool__(self) -> bool:
        return bool(self.blobs or self.grants or self.tags)


@dataclass(frozen=True, slots=True)
class IndexRows:
    blobs: list[BlobRow]  # least recently used first
    grants: list[tuple[GrantKey, int]]  # oldest first
    tags: list[tuple[TagRecord, int]]  # oldest first


def tag_key(record: TagRecord) -> TagKey:
    return (record.host, record.repository, record.tag, record.owner)


# An owner key is None (anonymous) or a string; a NULL in a primary key would not be unique, so
# each is stored as a string that no other owner can spell.
def _owner_column(owner: str | None) -> str:
    return "" if owner is None else f"={owner}"


def _owner_of(column: str) -> str | None:
    return None if column == "" else column[1:]


def _put(
    db: sqlite3.Connection,
    table: str,
    name: str,
    key: tuple[str, ...],
    fields: tuple[object, ...] | None,
) -> None:
    """The row of ``table`` (``grants``, ``tags``) at ``key`` — host, repository, ``name``,
    owner — set to ``key`` and ``fields``, or deleted (``None``)."""
    if fields is None:
        where = f"host = ? AND repository = ? AND {name} = ? AND owner = ?"
        db.execute(f"DELETE FROM {table} WHERE {where}", key)
    else:
        values = (*key, *fields)
        marks = ", ".join("?" * len(values))
        db.execute(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", values)


class Index:
    def __init__(self, path: str) -> None:
        self.path = path
        self._db = self._connect()

    @classmethod
    def open(cls, path: str) -> tuple[Index, IndexRows]:
        """Open the index at ``path`` and read it whole; afresh, empty, when it cannot be read."""
        try:
            index = cls(path)
        except sqlite3.DatabaseError as error:
            index = cls._afresh(path, error)
        try:
            return index, index.load()
        except sqlite3.DatabaseError as error:  # damage that the quick check did not see
            index.close()
            return cls._afresh(path, error), IndexRows([], [], [])

    @classmethod
    def _afresh(cls, path: str, error: sqlite3.DatabaseError) -> Index:
        log.warning("blob cache index %s unusable (%s): starting it afresh", path, error)
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)
        return cls(path)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError(f"corrupt: {'; '.join(problems[:3])}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema version {version}, not {SCHEMA_VERSION}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            if version == 0:  # a new file (a foreign one with tables fails CREATE TABLE)
                db.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.execute("COMMIT")
        except BaseException:
            db.close()
            raise
        return db

    def load(self) -> IndexRows:
        db = self._db
        blobs = [
            BlobRow(*row)
            for row in db.execute("SELECT digest, size, media_type, used FROM blobs ORDER BY used")
        ]
        grants = [
            ((host, repository, digest, _owner_of(owner)), seq)
            for host, repository, digest, owner, seq in db.execute(
                "SELECT host, repository, digest, owner, seq FROM grants ORDER BY seq"
            )
        ]
        tags = [
            (TagRecord(host, repository, tag, _owner_of(owner), digest, media_type, read_at), seq)
            for host, repository, tag, owner, digest, media_type, read_at, seq in db.execute(
                "SELECT host, repository, tag, owner, digest, media_type, read_at, seq FROM tags"
                " ORDER BY seq"
            )
        ]
        return IndexRows(blobs, grants, tags)

    def apply(self, changes: Changes) -> None:
        """Write ``changes`` in one transaction. A failure (a full disk) is logged, not raised:
        the store in memory is still right, and an index behind the files costs only cache."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            for digest, row in changes.blobs.items():
                if row is None:
                    db.execute("DELETE FROM blobs WHERE digest = ?", (digest,))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?, ?)",
                        (row.digest, row.size, row.media_type, row.used),
                    )
            for (host, repository, digest, owner), seq in changes.grants.items():
                key = (host, repository, digest, _owner_column(owner))
                _put(db, "grants", "digest", key, None if seq is None else (seq,))
            for (host, repository, tag, owner), value in changes.tags.items():
                key = (host, repository, tag, _owner_column(owner))
                if value is None:
                    _put(db, "tags", "tag", key, None)
                else:
                    record, seq = value
                    fields = (record.digest, record.media_type, record.read_at, seq)
                    _put(db, "tags", "tag", key, fields)
            db.execute("COMMIT")
        except sqlite3.Error as error:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            log.warning("blob cache index %s: cannot write it (%s)", self.path, error)

    def close(self) -> None:
        self._db.close()
