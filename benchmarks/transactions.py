"""Transactions per partition vs per loop (exactly-once v1 vs v2's shape), side by side.

    .venv/bin/python benchmarks/transactions.py [--partitions 4] [--records 50]
        [--polls 100] [--rounds 5] [--bytes 400] [--bootstrap HOST:PORT] [--smoke]

What a stage loop (:mod:`streams.owned_loop`) does per poll, on the real broker, without
the stage's own work: each poll carries ``--records`` records for each of ``--partitions``
input partitions; its outputs (one record per input record, to the same partition of an
output topic) and its input offsets (``send_offsets_to_transaction`` to a group) are
committed

- ``per_partition`` (today): one transactional producer per partition
  (``{group}-{p}``, started as :class:`streams.loop_clients.KafkaClients` starts them),
  one transaction per partition per poll, the partitions at once (``asyncio.gather``);
- ``per_loop`` (exactly-once v2's shape): one transactional producer for the loop, one
  transaction across the poll's partitions.

The two alternate round by round (the order flips every round) on the same records, so
both are measured in the same minutes of a shared machine. Per mode, the medians over the
rounds of: transactions/s, polls/s, messages/s, this process's CPU per message (µs;
``time.process_time``) and, when the broker is the local one (its pid known), the
broker's CPU per message (µs, from ``/proc``). Prints a table and, last, one JSON line.

The broker is ``--bootstrap`` (used as it is), else the local one of
:mod:`memstream.dev.broker` on ``MEMSTREAM_KAFKA_PORT`` (started if it is not running).
``--smoke``: tiny sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from aiokafka.admin import NewTopic
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from benchmarks import smoke
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.streams.loop_clients import KafkaClients

MODES = ("per_partition", "per_loop")


def _broker_cpu_s(pid: int | None) -> float | None:
    """The broker process's user+system CPU seconds (None: not a local process)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    """One run's topics, group and records; :meth:`round` measures one mode once."""

    def __init__(self, settings: Settings, args: argparse.Namespace, broker_pid: int | None):
        self.settings = settings
        self.args = args
        self.broker_pid = broker_pid
        run = uuid.uuid4().hex[:8]
        self.source = f"txbench-{run}-in"
        self.sink = f"txbench-{run}-out"
        self.group = f"txbench-{run}"
        self.clients = KafkaClients(settings)
        self.offsets = dict.fromkeys(range(args.partitions), 0)  # the next, per input
        self.values = [(f"user-{i % 97}".encode(), os.urandom(args.bytes))
                       for i in range(args.records)]

    async def setup(self) -> None:
        admin = kafka.admin(self.settings)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, self.args.partitions, 1)
                                       for t in (self.source, self.sink)])
        finally:
            await admin.close()

    async def teardown(self) -> None:
        admin = kafka.admin(self.settings)
        await admin.start()
        try:
            await admin.delete_topics([self.source, self.sink])
        except Exception:
            pass
        finally:
            await admin.close()

    def _offsets(self, partitions: list[int]) -> dict[TopicPartition, OffsetAndMetadata]:
        found = {}
        for p in partitions:
            self.offsets[p] += self.args.records
            found[TopicPartition(self.source, p)] = OffsetAndMetadata(self.offsets[p], "")
        return found

    async def _transaction(self, producer: Any, partitions: list[int]) -> None:
        await producer.begin_transaction()
        sent = [await producer.send(self.sink, key=k, value=v, partition=p)
                for p in partitions for k, v in self.values]
        await asyncio.gather(*sent)
        await producer.send_offsets_to_transaction(self._offsets(partitions), self.group)
        await producer.commit_transaction()

    async def round(self, mode: str) -> dict[str, float]:
        n = self.args.partitions
        if mode == "per_partition":
            producers = await asyncio.gather(*(self.clients.producer(f"{self.group}-{p}")
                                               for p in range(n)))
        else:
            producers = [await self.clients.producer(f"{self.group}-loop")]
        try:
            for _ in range(3):  # warm: connections, coordinators
                await self._poll(mode, producers)
            cpu, broker, t0 = time.process_time(), _broker_cpu_s(self.broker_pid), \
                time.perf_counter()
            for _ in range(self.args.polls):
                await self._poll(mode, producers)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu
            broker_after = _broker_cpu_s(self.broker_pid)
        finally:
            for producer in producers:
                await producer.stop()
        messages = self.args.polls * n * self.args.records
        txns = self.args.polls * (n if mode == "per_partition" else 1)
        found = {"txn_per_s": txns / wall, "polls_per_s": self.args.polls / wall,
                 "msg_per_s": messages / wall, "cpu_us_per_msg": cpu / messages * 1e6}
        if broker is not None and broker_after is not None:
            found["broker_cpu_us_per_msg"] = (broker_after - broker) / messages * 1e6
        return found

    async def _poll(self, mode: str, producers: list[Any]) -> None:
        parts = list(range(self.args.partitions))
        if mode == "per_partition":
            await asyncio.gather(*(self._transaction(producers[p], [p]) for p in parts))
        else:
            await self._transaction(producers[0], parts)


def _table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    keys = [k for k in ("txn_per_s", "polls_per_s", "msg_per_s", "cpu_us_per_msg",
                        "broker_cpu_us_per_msg") if k in results["per_loop"]]
    lines = [f"{args.partitions} partitions x {args.records} records/poll, {args.polls} polls "
             f"x {args.rounds} rounds (medians; machine may be busy)",
             f"{'':24}{'per_partition':>15}{'per_loop':>12}{'loop/part':>11}"]
    for k in keys:
        a, b = results["per_partition"][k], results["per_loop"][k]
        lines.append(f"{k:24}{a:15.1f}{b:12.1f}{b / a:11.2f}")
    return "\n".join(lines)


def broker(args: argparse.Namespace) -> tuple[Settings, int | None]:
    """The clients' settings and the broker's pid (None: not the local one)."""
    base = Settings()
    if args.bootstrap:
        return base.model_copy(update={"bootstrap_servers": args.bootstrap}), None
    pid = local_broker.start(base)  # (idempotent: the running one's pid)
    return local_broker.client_settings(base), pid


async def main(args: argparse.Namespace, settings: Settings,
               pid: int | None) -> dict[str, Any]:
    bench = Bench(settings, args, pid)
    await bench.setup()
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                runs[mode].append(await bench.round(mode))
                print(f"round {r + 1} {mode}: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in runs[mode][-1].items()), file=sys.stderr)
    finally:
        await bench.teardown()
    results = {m: {k: median(r[k] for r in runs[m]) for k in runs[m][0]} for m in MODES}
    print(_table(results, args))
    out = {"benchmark": "transactions", "smoke": args.smoke, "partitions": args.partitions,
           "records_per_partition_poll": args.records, "polls": args.polls,
           "rounds": args.rounds, "bytes": args.bytes, **{m: results[m] for m in MODES},
           "ratio_loop_over_partition": {k: results["per_loop"][k] / results["per_partition"][k]
                                         for k in results["per_loop"]}}
    print(json.dumps(out))
    return out


SMOKE = {"polls": 5, "rounds": 2, "records": 5}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=4, help="a loop's partitions (default "
                    "4: MEMSTREAM_PARTITIONS' default, one worker)")
    ap.add_argument("--records", type=int, default=50, help="records per partition per poll")
    ap.add_argument("--polls", type=int, default=100, help="polls per round and mode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bytes", type=int, default=400, help="bytes per record value")
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT")
    return smoke.parse(ap, SMOKE, argv)


if __name__ == "__main__":
    arguments = parse()
    asyncio.run(main(arguments, *broker(arguments)))
