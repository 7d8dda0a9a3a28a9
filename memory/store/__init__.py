"""The memory store: its protocol (:mod:`memory.store.protocol`, re-exported here), the
two Qdrant backends (:mod:`memory.store.edge`, :mod:`memory.store.server`), the store split by
partition (:mod:`memory.store.partitioned`), the swappable store and its switch, checksums and
the rebuild from the topics."""

from memstream.memory.store.protocol import *  # noqa: F403
