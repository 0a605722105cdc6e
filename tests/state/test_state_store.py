"""The state file (SPEC §7.3): SQLite in WAL mode, a versioned schema, refusals that never
lose a file silently, and a thread of its own for the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from kuikproxy.core.ringstate import EntryState, RingChanges, RingHeader, RingState
from kuikproxy.errors import StateError
from kuikproxy.state import Batch, StateStore, ThreadedStore
from kuikproxy.state import statefile as store_module
from kuikproxy.state.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION

WALL = 1_800_000_000.0  # a wall-clock time
OFFSET = WALL - 100.0  # the caller's clock reads 100 at WALL


def ring(cursor: str | None, *entries: EntryState, lap: int = 0) -> RingState:
    return RingState(RingHeader(cursor, lap, 60.0, 300.0), entries)


A = ring(
    "app/b:1",
    EntryState("app/a:1", 10.0, 60.0, 0),
    EntryState("app/b:1", 20.0, None, 0),
    EntryState("app/c:1", 30.0, 70.0, 1),
)
B = ring(None, EntryState("lib/x:1", 5.0, None, -1))


def whole(host: str, resource: str, state: RingState) -> tuple[str, str, RingChanges]:
    return host, resource, RingChanges.whole(state)


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "state.db")


def reopen(path: str, offset: float = OFFSET) -> dict[str, dict[str, RingState]]:
    store = StateStore(path)
    try:
        return store.load(offset).rings
    finally:
        store.close()


def test_round_trip_in_the_callers_clock(path: str) -> None:
    """Rings and blocks written with the caller's offset come back, after a reopen, in the
    clock of whoever reads them: the same values with the same offset, wall time with none."""
    store = StateStore(path)
    store.write(
        Batch(
            (
                whole("docker.io", "web", A),
                whole("docker.io", "api", B),
                whole("ghcr.io", "web", B),
            ),
            blocks=(("ghcr.io", 220.0),),
        ),
        OFFSET,
    )
    store.close()
    store = StateStore(path)
    saved = store.load(OFFSET)
    assert saved.rings == {"docker.io": {"web": A, "api": B}, "ghcr.io": {"web": B}}
    assert saved.blocks == {"ghcr.io": 220.0}
    wall = store.load(0.0)
    assert wall.blocks == {"ghcr.io": WALL + 120.0}
    header = wall.rings["docker.io"]["web"].header
    assert header.cycle_started == WALL - 40.0
    assert header.cycle_duration == 300.0  # a duration is the same in every clock
    assert wall.rings["docker.io"]["web"].entries[0] == EntryState(
        "app/a:1", WALL - 90.0, WALL - 40.0, 0
    )
    store.close()


def test_changes_update_replace_drop_and_remove_rings(path: str) -> None:
    """Changes upsert the entries they carry and delete the ones dropped; ``replace`` clears
    what the ring held first; a ring whose header is None is removed with its entries."""
    store = StateStore(path)
    store.write(Batch((whole("h", "web", A), whole("h", "api", B))))
    moved = RingChanges(
        RingHeader("app/c:1", 1, 90.0, 80.0),
        (EntryState("app/c:1", 30.0, 90.0, 1), EntryState("app/d:1", 40.0, None, -1)),
        dropped=("app/a:1",),
        replace=False,
    )
    store.write(Batch((("h", "web", moved), ("h", "api", RingChanges(None, (), (), False)))))
    saved = store.load().rings
    assert saved == {
        "h": {
            "web": RingState(
                moved.header,
                (
                    EntryState("app/b:1", 20.0, None, 0),
                    EntryState("app/c:1", 30.0, 90.0, 1),
                    EntryState("app/d:1", 40.0, None, -1),
                ),
            )
        }
    }
    fresh = RingChanges(
        RingHeader(None, 0, None, None), (EntryState("new:1", 1.0, None, -1),), (), True
    )
    store.write(Batch((("h", "web", fresh),)))
    assert store.load().rings == {"h": {"web": RingState(fresh.header, fresh.entries)}}
    store.close()


def test_a_full_batch_replaces_everything(path: str) -> None:
    store = StateStore(path)
    store.write(Batch((whole("h", "web", A), whole("h", "api", B)), blocks=(("h", 5.0),)))
    store.write(Batch((whole("g", "web", B),), full=True))
    saved = store.load()
    assert saved.rings == {"g": {"web": B}}
    assert saved.blocks == {}
    store.close()


def test_a_failed_write_changes_nothing(path: str) -> None:
    """One batch is one transaction: one that fails half-way leaves the file as it was, and
    says so with a StateError."""
    store = StateStore(path)
    store.write(Batch((whole("h", "web", A),)))
    broken = RingChanges(
        RingHeader("x", 9, 1.0, 1.0),
        (EntryState(None, 1.0, None, 0),),  # type: ignore[arg-type]  # image is NOT NULL
        (),
        True,
    )
    with pytest.raises(StateError, match="cannot write it"):
        store.write(Batch((whole("h", "api", B), ("h", "web", broken))))
    assert store.load().rings == {"h": {"web": A}}
    store.close()


def test_wal_mode_and_schema_version(path: str) -> None:
    """A new file is in WAL mode, marked as kuikproxy's, at the latest schema version."""
    store = StateStore(path)
    assert store.version == SCHEMA_VERSION == len(MIGRATIONS)
    store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    finally:
        db.close()


def test_an_older_file_is_migrated_and_keeps_its_state(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file at an older version is brought up to date step by step, its rows kept."""
    store = StateStore(path)
    store.write(Batch((whole("h", "web", A),)))
    store.close()
    step = "ALTER TABLE rings ADD COLUMN note TEXT;"
    monkeypatch.setattr(store_module, "MIGRATIONS", (*MIGRATIONS, step))
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    store = StateStore(path)
    assert store.version == SCHEMA_VERSION + 1
    assert store.load().rings == {"h": {"web": A}}
    store.close()


def test_a_file_of_a_newer_version_is_refused(path: str) -> None:
    """A file a newer kuikproxy wrote is refused as it is, not migrated down or overwritten."""
    StateStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    newer = rf"newer kuikproxy \(schema version {SCHEMA_VERSION + 1}; .* up to {SCHEMA_VERSION}\)"
    with pytest.raises(StateError, match=newer):
        StateStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    db.close()


def test_a_file_that_is_not_a_database_is_refused(path: str) -> None:
    Path(path).write_bytes(b"certainly not SQLite\n" * 400)
    with pytest.raises(StateError, match=r"not a database, or corrupt.*move it away"):
        StateStore(path)
    assert Path(path).read_bytes() == b"certainly not SQLite\n" * 400  # never written over


def test_a_corrupt_database_is_refused(path: str) -> None:
    """Pages overwritten in the middle of a real state file: refused at open."""
    store = StateStore(path)
    many = ring(
        None, *(EntryState(f"app/img{i:05d}:latest", float(i), None, 0) for i in range(3000))
    )
    store.write(Batch((whole("h", "web", many),)))
    store.close()
    data = bytearray(Path(path).read_bytes())
    page = 4096
    assert len(data) > 6 * page
    data[3 * page : 5 * page] = b"\xa5" * (2 * page)
    Path(path).write_bytes(bytes(data))
    with pytest.raises(StateError, match=f"state file {path}: .*corrupt|malformed"):
        StateStore(path)


def test_someone_elses_database_is_refused(path: str) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE rings (anything TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StateError, match="not a kuikproxy state file"):
        StateStore(path)


def test_a_file_in_use_by_another_kuikproxy_is_refused(path: str) -> None:
    """The file is locked while a store has it open: a second one is refused, not let in to
    overwrite the first one's rings."""
    first = StateStore(path)
    with pytest.raises(StateError, match="in use by another kuikproxy"):
        StateStore(path, busy_timeout=0)
    first.close()
    StateStore(path, busy_timeout=0).close()


def test_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="cannot open it"):
        StateStore(str(tmp_path / "no" / "such" / "state.db"))


async def test_threaded_store_writes_in_order_off_the_loop(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches queued from the loop by many coroutines at once are written on one thread, not
    the loop's, in the order they were queued: the last one queued is what the file holds."""
    threads: set[int] = set()
    write = StateStore.write

    def recording(self: StateStore, batch: Batch, offset: float = 0.0) -> None:
        threads.add(threading.get_ident())
        write(self, batch, offset)

    monkeypatch.setattr(StateStore, "write", recording)
    store = await ThreadedStore.open(path)

    async def writer(n: int) -> None:
        state = ring(f"app/{n:03d}:1", EntryState("app/a:1", 1.0, None, n), lap=n)
        await store.write(Batch((whole("h", "web", state),)), OFFSET)

    await asyncio.gather(*(writer(n) for n in range(100)))
    saved = await store.load(OFFSET)
    assert saved.rings["h"]["web"].header.lap == 99
    assert len(threads) == 1 and threading.get_ident() not in threads
    await store.close()
    assert reopen(path)["h"]["web"].header.cursor == "app/099:1"


@pytest.fixture
def garbage(path: str) -> str:
    Path(path).write_bytes(b"\0garbage" * 1000)
    return path


async def test_threaded_store_open_refuses_like_the_store(garbage: str) -> None:
    with pytest.raises(StateError, match="not a database"):
        await ThreadedStore.open(garbage)
