"""Which record batch to set aside, and the reference its dead letter carries."""

from __future__ import annotations

import pytest

from memstream.topics.batch_refs import (
    Batch,
    ReadFirst,
    Reference,
    SetAside,
    decide,
    error_label,
    parse_reference,
    reference_reason,
)

pytestmark = pytest.mark.unit
CODEC = "UnsupportedCodecError"


def test_a_bad_batch_at_the_position_is_set_aside_whole():
    batches = [Batch(10, 14, error=CODEC), Batch(15, 15)]
    assert decide(10, batches) == SetAside(10, 14, CODEC)


def test_records_before_the_bad_batch_are_read_first():
    batches = [Batch(10, 12), Batch(13, 14, error=CODEC)]
    assert decide(10, batches) == ReadFirst(13)
    # once they are handled (position 13) the batch is set aside
    assert decide(13, batches) == SetAside(13, 14, CODEC)


def test_markers_before_the_bad_batch_need_no_read():
    batches = [Batch(10, 10, control=True), Batch(11, 14, error="CorruptRecordException")]
    assert decide(10, batches) == SetAside(11, 14, "CorruptRecordException")


def test_a_read_that_hands_nothing_over_sets_aside_from_the_position():
    """Aborted records before the bad batch: decodable, but no read returns them."""
    batches = [Batch(10, 12), Batch(13, 14, error=CODEC)]
    assert decide(10, batches, stuck=True) == SetAside(10, 14, CODEC)


def test_a_position_inside_the_bad_batch_starts_the_range_there():
    assert decide(12, [Batch(10, 14, error=CODEC)]) == SetAside(12, 14, CODEC)


def test_batches_before_the_position_are_not_looked_at():
    batches = [Batch(5, 9, error=CODEC), Batch(10, 11)]
    assert decide(10, batches) is None


def test_a_partition_whose_batches_all_decode_is_not_the_culprit():
    assert decide(0, [Batch(0, 3), Batch(4, 4, control=True)]) is None
    assert decide(0, []) is None


def test_the_reference_names_error_topic_partition_and_range_and_parses_back():
    reason = reference_reason(CODEC, "memstream.messages", 3, 120, 131, "snappy")
    assert reason.startswith(CODEC)
    assert "topic=memstream.messages partition=3 offsets=120..131" in reason
    assert parse_reference(reason) == Reference("memstream.messages", 3, 120, 131)
    assert parse_reference("schema: missing field") is None
    assert parse_reference("topic=t partition=0 offsets=5..4") is None


def test_metric_labels_are_bounded():
    assert error_label(CODEC) == CODEC
    assert error_label("SomethingNew") == "other"
