"""``memstream status``: the cluster as the workers see it (``GET /v1/cluster`` of each).

Asks every URL given (default: this machine's worker, ``Settings.api_url()``) with the
admin key (over HTTPS verified with ``web_tls_ca`` when set), and renders one table: the
workers, each partition's owner and standbys, each worker's shards (serving, restoring x,
standby) and lag, the last restores. A worker that does not answer is listed as such.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from memstream.contract.http_api import paths
from memstream.core.errors import ConfigError
from memstream.core.settings import Settings


def key_of(settings: Settings) -> str:
    """The admin key: ``/v1/cluster`` names every worker's URL, which the metrics key (a
    scraper's) does not open."""
    if settings.admin_key is not None and settings.admin_key.get_secret_value():
        return settings.admin_key.get_secret_value()
    raise ConfigError("memstream status needs MEMSTREAM_ADMIN_KEY")


def gather(settings: Settings, urls: Sequence[str], timeout: float = 5.0,
           transport: httpx.BaseTransport | None = None) -> dict[str, Any]:
    """url -> its ``/v1/cluster`` answer, or ``{"error": ...}``; then the other workers the
    first answer names are asked too."""
    headers = {"Authorization": f"Bearer {key_of(settings)}"}
    found: dict[str, Any] = {}
    todo = [u.rstrip("/") for u in urls]
    verify: Any = str(settings.web_tls_ca) if settings.web_tls_ca is not None else True
    with httpx.Client(headers=headers, timeout=timeout, transport=transport,
                      verify=verify) as http:
        while todo:
            url = todo.pop(0)
            if url in found:
                continue
            try:
                r = http.get(url + paths.CLUSTER)
                found[url] = r.json() if r.status_code == 200 else {
                    "error": f"HTTP {r.status_code}"}
            except httpx.HTTPError as exc:
                found[url] = {"error": type(exc).__name__}
                continue
            todo += [u for u in found[url].get("workers", {}).values() if u not in found]
    return found


def serves_what_it_owns(status: Mapping[str, Any]) -> bool:
    """A worker's ``/v1/cluster`` answer: every partition the map gives it is served
    (restored, not still being taken)."""
    mine = {p for p, v in status["partitions"].items() if v["owner"] == status["worker"]}
    return mine == {p for p, state in status["shards"].items() if state == "serving"}


def render(found: dict[str, Any]) -> str:
    lines = []
    answered = [s for s in found.values() if "error" not in s]
    for url, status in found.items():
        if "error" in status:
            lines.append(f"worker {url}: not answering ({status['error']})")
            continue
        shards = status.get("shards", {})
        by_state: dict[str, list[str]] = {}
        for p, state in sorted(shards.items(), key=lambda kv: int(kv[0])):
            by_state.setdefault(state, []).append(p)
        lag = sum(status.get("lag", {}).values())
        lines.append(f"worker {status['worker']} {url}: store {status['store']}, "
                     f"groups aligned: {status['groups_aligned']}, lag {lag}, "
                     f"requests {status.get('requests', {})}")
        for state, parts in by_state.items():
            lines.append(f"  {state}: partitions {', '.join(parts)}")
        for r in status.get("restores", [])[-5:]:
            lines.append(f"  restored partition {r['partition']}: {r['changes']} changes in "
                         f"{r['seconds']} s")
    if answered:
        lines.append("partition  owner  standbys")
        for p, v in answered[0]["partitions"].items():
            lines.append(f"{p:>9}  {v['owner']}  {', '.join(v['standbys']) or '-'}")
    return "\n".join(lines)
