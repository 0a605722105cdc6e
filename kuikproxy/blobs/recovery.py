"""What opening a blob store does before it serves, on the index's thread: take the lock,
delete the temp files a killed process left, and make the index and the files agree.

The files win. A row whose file is missing, or of another size, is dropped with its grants and
tags. Contents are not hashed here: a start keeps no marks (:mod:`kuikproxy.blobs.marks`), so
each file is hashed at its first serve after it, not all of them before the store serves.

A file with no row is deleted, not kept with an unknown media type and no grants: with no
grant nobody may be given it (R5), and without its media type a manifest cannot be answered as
it was read; kept, it would only take room until evicted. Such a file is one stored less than
a flush interval before a kill, or the whole cache after the index was lost: both cost only
reads upstream, where keeping it would need the index to be trusted more than the files.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from dataclasses import dataclass

from kuikproxy.blobs import disk
from kuikproxy.blobs.disk import Layout
from kuikproxy.blobs.index import Changes, Index, IndexRows, tag_key
from kuikproxy.errors import StateError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Recovered:
    lock: int  # the lock's descriptor: held while the store is open
    index: Index
    loaded: IndexRows  # only rows of blobs whose files are there


def recover(layout: Layout) -> Recovered:
    """Raises :class:`~kuikproxy.errors.StateError` when the directory cannot be used."""
    try:
        lock = disk.lock(layout)
    except OSError as error:
        raise StateError(f"blob cache {layout.root}: cannot use it ({error})") from error
    try:
        disk.clear_tmp(layout)
        index, loaded = Index.open(layout.index)
        try:
            return Recovered(lock, index, _agree(layout, index, loaded))
        except BaseException:
            index.close()
            raise
    except BaseException as error:
        os.close(lock)
        if isinstance(error, OSError | sqlite3.Error):
            raise StateError(f"blob cache {layout.root}: cannot use it ({error})") from error
        raise


def _agree(layout: Layout, index: Index, loaded: IndexRows) -> IndexRows:
    files = disk.scan(layout)
    blobs = [row for row in loaded.blobs if files.get(row.digest) == row.size]
    kept = {row.digest for row in blobs}
    strays = [digest for digest in files if digest not in kept]
    for digest in strays:
        disk.remove(layout.blob(digest))
    changes = Changes(
        blobs={row.digest: None for row in loaded.blobs if row.digest not in kept},
        grants={key: None for key, _ in loaded.grants if key[2] not in kept},
        tags={tag_key(record): None for record, _ in loaded.tags if record.digest not in kept},
    )
    if changes or strays:
        log.warning(
            "blob cache %s: %d index rows without their file dropped, %d files without a row "
            "deleted",
            layout.root,
            len(changes.blobs),
            len(strays),
        )
    if changes:
        index.apply(changes)
    return IndexRows(
        blobs,
        [(key, seq) for key, seq in loaded.grants if key[2] in kept],
        [(record, seq) for record, seq in loaded.tags if record.digest in kept],
    )
