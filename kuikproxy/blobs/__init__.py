"""The pull-through cache's blobs on disk, content-addressed and bounded (R1, R5, R6)."""

from kuikproxy.blobs.records import Stored, TagRecord
from kuikproxy.blobs.store import BlobStore
from kuikproxy.blobs.writer import BlobWriter

__all__ = ["BlobStore", "BlobWriter", "Stored", "TagRecord"]
