"""Pacing state that survives a restart (SPEC §7.3, P13): a SQLite file, off the event loop."""

from kuikproxy.state.statefile import Batch, Saved, StateStore
from kuikproxy.state.threaded import ThreadedStore

__all__ = ["Batch", "Saved", "StateStore", "ThreadedStore"]
