"""The client's version: its installed distribution's, else the repository's VERSION file
(a checkout that is not installed), else unknown."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def client_version() -> str:
    try:
        return version("memstream-client")
    except PackageNotFoundError:
        pass
    try:  # clients/python/VERSION (a link to the repository's)
        return (Path(__file__).resolve().parents[2] / "VERSION").read_text().strip()
    except OSError:
        return "0+unknown"


__version__ = client_version()
