"""What kuikproxy shows of itself: ``/status`` and its schema, ``/metrics``, the status page and
the recent windows it draws — each read from one :class:`~kuikproxy.runtime.snapshot.Snapshot`
of the runtime, above it, beside the data path (``web/``), which knows nothing of them."""
