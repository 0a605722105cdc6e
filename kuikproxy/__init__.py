"""kuikproxy: an egress proxy that paces container registry reads (see README.md)."""

__version__ = "0.1.0"
