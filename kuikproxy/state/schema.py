"""The state file's schema and how it got there: one migration per version.

``PRAGMA user_version`` is the number of migrations applied; a kuikproxy opens a file at any
version up to :data:`SCHEMA_VERSION`, brings it up to date, and refuses a newer one (it cannot
know what that version means). ``PRAGMA application_id`` marks the file as kuikproxy's, so that
a path pointing at someone else's database is refused instead of written into.

Times are wall-clock seconds (``time.time()``): they must mean the same in the next process.
Tables are ``WITHOUT ROWID``: every lookup is by its primary key, and a ring's entries are read
in key order, one ring after the other.
"""

from __future__ import annotations

APPLICATION_ID = 0x6B75696B  # "kuik"

MIGRATIONS: tuple[str, ...] = (
    # 1: rings (P5, P6), their images (P8, R1), registry blocks (§11)
    """
    CREATE TABLE rings (
        host TEXT NOT NULL,
        resource TEXT NOT NULL,
        cursor TEXT,
        lap INTEGER NOT NULL,
        cycle_started_wall REAL,
        cycle_duration REAL,
        PRIMARY KEY (host, resource)
    ) WITHOUT ROWID;
    CREATE TABLE entries (
        host TEXT NOT NULL,
        resource TEXT NOT NULL,
        image TEXT NOT NULL,
        asked_wall REAL NOT NULL,
        answered_wall REAL,
        lap INTEGER NOT NULL,
        PRIMARY KEY (host, resource, image)
    ) WITHOUT ROWID;
    CREATE TABLE blocks (
        host TEXT NOT NULL PRIMARY KEY,
        until_wall REAL NOT NULL
    ) WITHOUT ROWID;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)
