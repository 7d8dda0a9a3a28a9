"""Record batches a reader cannot decode: which to set aside, and the reference to them.

A Kafka client decompresses a record batch (and checks its CRC) before it hands over any of
its records; a batch written with a codec the reader lacks, or corrupted, fails every read
of its partition, again after every restart. The headers of a batch (its first offset and
its last offset delta) are readable without decompressing it, so the batch can be set aside
*by reference*: a dead letter naming the topic, the partition and the offset range (no value
bytes: the batch stays in its topic until retention), and the partition goes on after it.
An operator re-drives the range once a reader can decode it (``memstream redrive``, which
parses the reference back with :func:`parse_reference`).

Pure: the Kafka side (fetching the raw batches, the transaction) is
:mod:`memstream.streams.undecodable`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KIND = "undecodable"  # the dead letter's kind (``InvalidRecord.kind``)
# the errors named in metric labels; anything else counts as "other"
KNOWN_ERRORS = frozenset({"UnsupportedCodecError", "CorruptRecordException",
                          "UnsupportedVersionError"})


@dataclass(frozen=True)
class Batch:
    """One record batch's headers, and whether its records decode."""

    base: int  # first offset
    last: int  # base + last offset delta
    control: bool = False  # a transaction marker (no data: never decoded by a reader)
    error: str | None = None  # the error class decoding raised; None: it decodes


@dataclass(frozen=True)
class SetAside:
    """Set aside offsets ``first``..``last`` (the partition goes on at ``last + 1``)."""

    first: int
    last: int
    error: str


@dataclass(frozen=True)
class ReadFirst:
    """Decodable records lie between the position and the undecodable batch starting at
    ``base``: they are read (handled and committed) before it is set aside."""

    base: int


def decide(position: int, batches: list[Batch], *, stuck: bool = False,
           ) -> SetAside | ReadFirst | None:
    """What to do about the partition read from ``position`` (``batches``: the headers of
    what a fetch from there returned, in order). None: every batch decodes (the failure was
    not this partition's). ``stuck``: a read from ``position`` returned nothing before it
    failed (what lies before the bad batch is markers or aborted records), so the range
    starts at the position."""
    data_before = False
    for batch in batches:
        if batch.last < position:
            continue
        if batch.error is not None:
            if data_before and not stuck:
                return ReadFirst(batch.base)
            return SetAside(position if stuck else max(batch.base, position), batch.last,
                            batch.error)
        if not batch.control:
            data_before = True
    return None


def error_label(error: str) -> str:
    """A bounded metric label for an error class name."""
    return error if error in KNOWN_ERRORS else "other"


def reference_reason(error: str, topic: str, partition: int, first: int, last: int,
                     detail: str = "") -> str:
    """The dead letter's reason: the error class, then where the batch is (parsed back by
    :func:`parse_reference`); ``detail`` (e.g. ``describe(exc)``) last."""
    text = (f"{error}: record batch not decoded; set aside by reference: "
            f"topic={topic} partition={partition} offsets={first}..{last}")
    return f"{text} ({detail})" if detail else text


@dataclass(frozen=True)
class Reference:
    topic: str
    partition: int
    first: int
    last: int


_REF = re.compile(r"topic=(?P<topic>[A-Za-z0-9._-]+) partition=(?P<partition>\d+) "
                  r"offsets=(?P<first>\d+)\.\.(?P<last>\d+)")


def parse_reference(reason: str) -> Reference | None:
    """The range a set-aside batch's dead letter names (None: not such a dead letter)."""
    found = _REF.search(reason)
    if found is None:
        return None
    ref = Reference(found["topic"], int(found["partition"]), int(found["first"]),
                    int(found["last"]))
    return ref if ref.first <= ref.last else None
