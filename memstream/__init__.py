"""memstream: long-term memory for LLM agents as a Kafka stream-processing pipeline."""

from __future__ import annotations

from pathlib import Path


def _version() -> str:
    """The one version source is the file ``VERSION`` at the repository root.

    In a checkout (the file and ``pyproject.toml`` beside the package folder) it is read
    directly: an editable install's metadata keeps the version of its last ``pip install``,
    stale after a bump. Installed from a wheel, the file is not there and the metadata that
    was built from it answers.
    """
    root = Path(__file__).resolve().parent.parent
    if (root / "VERSION").is_file() and (root / "pyproject.toml").is_file():
        return (root / "VERSION").read_text().strip()
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memstream")
    except PackageNotFoundError:  # neither a checkout nor installed: a copied folder
        return "0+unknown"


__version__ = _version()
