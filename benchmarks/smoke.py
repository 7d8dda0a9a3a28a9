"""The ``--smoke`` option every benchmark has: tiny sizes, to check that it still runs (the
README's test command runs each so; explicit options win over the smoke sizes)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any


def parse(ap: argparse.ArgumentParser, sizes: Mapping[str, Any],
          argv: Sequence[str] | None = None, *,
          what: str = "tiny sizes, to check it runs") -> argparse.Namespace:
    """Add ``--smoke`` to ``ap`` and parse ``argv``; with it, ``sizes`` are the defaults."""
    ap.add_argument("--smoke", action="store_true",
                    help=f"{what}: {dict(sizes)} (explicit options win)")
    args = ap.parse_args(argv)
    if args.smoke:
        ap.set_defaults(**sizes)
        args = ap.parse_args(argv)
    return args
