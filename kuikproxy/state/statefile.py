"""The state file (SPEC §7.3, P13): what of the pacing survives a restart, in SQLite.

A :class:`StateStore` is one connection, used from the one thread that opened it (sqlite3's
own check); :class:`~kuikproxy.state.threaded.ThreadedStore` gives the event loop that thread.

* WAL journal, ``synchronous=FULL``: a commit is one append to the log, and it is on disk when
  :meth:`StateStore.write` returns, so a decision written before its read goes upstream
  survives a power cut, not only the process being killed.
* ``locking_mode=EXCLUSIVE``: the file is locked while kuikproxy runs (the lock dies with the
  process), so a second kuikproxy pointed at the same file is refused at start instead of the
  two overwriting each other's rings.
* Opening refuses, with a :class:`~kuikproxy.errors.StateError`, a file that is not a database
  or fails SQLite's quick check, one that belongs to something else, and one written by a newer
  kuikproxy; it never starts afresh over a file it cannot read.

Times are stored as wall-clock seconds. Callers speak their own clock and say how it relates:
``offset`` is what to add to one of their times to make it wall-clock time.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

from kuikproxy.core.ringstate import EntryState, RingChanges, RingHeader, RingState
from kuikproxy.errors import StateError
from kuikproxy.state.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION

MOVE_AWAY = "move it away to start with no saved pacing state"


@dataclass(frozen=True, slots=True)
class Saved:
    """Everything a file holds, times in the caller's clock."""

    rings: dict[str, dict[str, RingState]]  # host → resource → ring
    blocks: dict[str, float]  # host → the end of its block (it may be over already)


@dataclass(frozen=True, slots=True)
class Batch:
    """One transaction: ring changes applied in order, then blocks. ``full``: the batch holds
    everything, and what the file held before is dropped."""

    rings: tuple[tuple[str, str, RingChanges], ...]  # (host, resource, changes)
    blocks: tuple[tuple[str, float], ...] = ()  # (host, until)
    full: bool = False


def _to_wall(t: float | None, offset: float) -> float | None:
    return None if t is None else t + offset


def _from_wall(wall: float | None, offset: float) -> float | None:
    return None if wall is None else wall - offset


class StateStore:
    def __init__(self, path: str, *, busy_timeout: float = 5.0) -> None:
        """Open (or create) the file at ``path`` and bring its schema up to date.
        ``busy_timeout``: how long to wait for another process's lock on it."""
        self.path = path
        try:
            self._db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
        except sqlite3.Error as error:
            raise self._error(f"cannot open it ({error})") from error
        try:
            self._open()
        except BaseException:
            self._db.close()
            raise

    def _error(self, reason: str) -> StateError:
        return StateError(f"state file {self.path}: {reason}")

    def _unusable(self, doing: str, error: sqlite3.OperationalError) -> StateError:
        if error.sqlite_errorname == "SQLITE_BUSY":
            return self._error(f"in use by another kuikproxy (cannot {doing} it: {error})")
        return self._error(f"cannot {doing} it ({error})")

    def _pragma(self, name: str) -> int:
        row = self._db.execute(f"PRAGMA {name}").fetchone()
        return int(row[0])

    def _open(self) -> None:
        db = self._db
        try:
            version = self._pragma("user_version")
            owner = self._pragma("application_id")
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.OperationalError as error:  # locked, unreadable: the file may be fine
            raise self._unusable("read", error) from error
        except sqlite3.DatabaseError as error:
            raise self._error(f"not a database, or corrupt ({error}); {MOVE_AWAY}") from error
        if owner != APPLICATION_ID and (owner or version or tables):
            raise self._error(f"not a kuikproxy state file; {MOVE_AWAY}")
        if version > SCHEMA_VERSION:
            raise self._error(
                f"written by a newer kuikproxy (schema version {version}; this one knows up to "
                f"{SCHEMA_VERSION}): run that version, or {MOVE_AWAY}"
            )
        try:
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise self._error(f"corrupt ({'; '.join(problems[:5])}); {MOVE_AWAY}")
            db.execute("PRAGMA locking_mode = EXCLUSIVE")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            db.execute("PRAGMA synchronous = FULL")
            db.execute("BEGIN IMMEDIATE")  # takes the exclusive lock now, not at the first write
            db.execute("COMMIT")
        except sqlite3.OperationalError as error:
            raise self._unusable("lock", error) from error
        except sqlite3.DatabaseError as error:
            raise self._error(f"corrupt ({error}); {MOVE_AWAY}") from error
        if mode != "wal":
            raise self._error(f"cannot use a write-ahead log on it (journal mode {mode})")
        self._migrate(version)

    def _migrate(self, version: int) -> None:
        for step in range(version, SCHEMA_VERSION):
            script = (
                "BEGIN IMMEDIATE;\n"
                f"{MIGRATIONS[step]}\n"
                f"PRAGMA application_id = {APPLICATION_ID};\n"
                f"PRAGMA user_version = {step + 1};\n"
                "COMMIT;"
            )
            try:
                self._db.executescript(script)
            except sqlite3.Error as error:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise self._error(f"cannot migrate it to version {step + 1} ({error})") from error

    @property
    def version(self) -> int:
        return self._pragma("user_version")

    def load(self, offset: float = 0.0) -> Saved:
        """Everything the file holds; a time ``w`` in it is ``w - offset`` in what is returned."""
        try:
            return self._load(offset)
        except sqlite3.DatabaseError as error:
            raise self._error(f"cannot read it ({error}); {MOVE_AWAY}") from error

    def _load(self, offset: float) -> Saved:
        db = self._db
        headers = {
            (host, resource): RingHeader(cursor, lap, _from_wall(started, offset), duration)
            for host, resource, cursor, lap, started, duration in db.execute(
                "SELECT host, resource, cursor, lap, cycle_started_wall, cycle_duration FROM rings"
            )
        }
        rings: dict[str, dict[str, RingState]] = {}
        rows = db.execute(
            "SELECT host, resource, image, asked_wall, answered_wall, lap FROM entries"
            " ORDER BY host, resource"
        )
        for key, group in groupby(rows, key=itemgetter(0, 1)):
            header = headers.get(key)
            if header is None:  # never written so: a ring and its entries go in one transaction
                continue
            entries = tuple(
                EntryState(image, asked - offset, _from_wall(answered, offset), lap)
                for _, _, image, asked, answered, lap in group
            )
            rings.setdefault(key[0], {})[key[1]] = RingState(header, entries)
        blocks = {
            host: until - offset
            for host, until in db.execute("SELECT host, until_wall FROM blocks")
        }
        return Saved(rings, blocks)

    def write(self, batch: Batch, offset: float = 0.0) -> None:
        """Apply ``batch`` in one transaction, on disk when this returns; a time ``t`` in it is
        stored as ``t + offset``."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                if batch.full:
                    for table in ("entries", "rings", "blocks"):
                        db.execute(f"DELETE FROM {table}")
                for host, resource, changes in batch.rings:
                    self._write_ring(host, resource, changes, offset)
                db.executemany(
                    "INSERT OR REPLACE INTO blocks VALUES (?, ?)",
                    [(host, until + offset) for host, until in batch.blocks],
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as error:
            raise self._error(f"cannot write it ({error})") from error

    def _write_ring(self, host: str, resource: str, changes: RingChanges, offset: float) -> None:
        db, key = self._db, (host, resource)
        header = changes.header
        if header is None or changes.replace:
            db.execute("DELETE FROM entries WHERE host = ? AND resource = ?", key)
        if header is None:
            db.execute("DELETE FROM rings WHERE host = ? AND resource = ?", key)
            return
        db.execute(
            "INSERT OR REPLACE INTO rings VALUES (?, ?, ?, ?, ?, ?)",
            (
                *key,
                header.cursor,
                header.lap,
                _to_wall(header.cycle_started, offset),
                header.cycle_duration,
            ),
        )
        db.executemany(
            "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)",
            [
                (*key, e.image, e.asked + offset, _to_wall(e.answered, offset), e.lap)
                for e in changes.entries
            ],
        )
        db.executemany(
            "DELETE FROM entries WHERE host = ? AND resource = ? AND image = ?",
            [(*key, image) for image in changes.dropped],
        )

    def close(self) -> None:
        self._db.close()
