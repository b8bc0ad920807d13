"""HareMQ's version, written once: in pyproject.toml, read back from the installed metadata."""
from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("haremq")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
