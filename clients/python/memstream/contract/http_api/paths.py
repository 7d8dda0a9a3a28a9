"""Every path of the worker's HTTP API, written once: the server's route table
(:mod:`memstream.web.http`), the Python client (:mod:`memstream.client`) and the tests use
these constants, so a path cannot be spelled two ways.

Plain strings and the standard library only: the client imports this module, so it imports
nothing from the server side. A placeholder (``{tenant}``, ``{user}``, ``{memory_id}``,
``{job_id}``, ``{session_id}``) is aiohttp's route syntax and OpenAPI's alike; :func:`fill`
puts ids in them.
The inspector's JavaScript (``web/inspector/app.js``) writes the same prefixes; a unit test
holds it to these.
"""

from __future__ import annotations

import re
from urllib.parse import quote

# Prefixes: not routes themselves.
V1 = "/v1"
TENANT = V1 + "/tenants/{tenant}"
USER = TENANT + "/users/{user}"
PREFIXES = (V1, TENANT, USER)

# No key / any key.
HEALTH = V1 + "/health"
LIVE = V1 + "/live"  # liveness: the process and its event loop run
OPENAPI = V1 + "/openapi.json"
TOOLS = V1 + "/tools"
WHOAMI = V1 + "/whoami"  # whom the presented key opens (memstream mcp: its tenant)

# One tenant and one user.
MEMORIES = USER + "/memories"
SEARCH = USER + "/search"
CONTEXT = USER + "/context"
FEEDBACK = USER + "/feedback"
EXECUTE_TOOL = USER + "/tools/execute"

# The HTTP way in: chat messages and a session's end, produced to their topics.
MESSAGES = USER + "/messages"
SESSION_END = USER + "/sessions/{session_id}/end"

# History, corrections, forget-me and the audit log.
MEMORY = MEMORIES + "/{memory_id}"
MEMORY_HISTORY = MEMORY + "/history"
MEMORY_SOURCE = MEMORY + "/source"
MEMORY_ROLLBACK = MEMORY + "/rollback"
CHANGES = USER + "/changes"
FORGET = USER + "/forget"
RESIDUE = USER + "/residue"
UNDO_JOB = USER + "/jobs/{job_id}/undo"
AUDIT = TENANT + "/audit"

# Metrics (the metrics key or the admin key).
METRICS = "/metrics"
METRICS_SUMMARY = V1 + "/metrics/summary"
CLUSTER = V1 + "/cluster"

# The inspector page and its files (no key: they hold no data).
INSPECTOR = "/inspector"
INSPECTOR_APP = INSPECTOR + "/app.js"
INSPECTOR_LOGIC = INSPECTOR + "/logic.js"
INSPECTOR_CHARTS = INSPECTOR + "/charts.js"
INSPECTOR_DOM = INSPECTOR + "/dom.js"
INSPECTOR_METRICS = INSPECTOR + "/metrics.js"
INSPECTOR_STYLE = INSPECTOR + "/style.css"

ROUTE_PATHS: tuple[str, ...] = (
    HEALTH, OPENAPI, TOOLS, WHOAMI, MEMORIES, SEARCH, CONTEXT, FEEDBACK, EXECUTE_TOOL,
    MESSAGES, SESSION_END,
    MEMORY, MEMORY_HISTORY, MEMORY_SOURCE, MEMORY_ROLLBACK, CHANGES, FORGET, RESIDUE,
    UNDO_JOB, AUDIT, METRICS, METRICS_SUMMARY, CLUSTER, INSPECTOR, INSPECTOR_APP, INSPECTOR_LOGIC,
    INSPECTOR_CHARTS, INSPECTOR_DOM, INSPECTOR_METRICS, INSPECTOR_STYLE,
    LIVE,
)
"""Every path the server serves (some with more than one method)."""

PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# Left as they are: every character an id may hold (contract.records.ID_PATTERN), so a valid
# id goes into the URL exactly as given; anything else ("/", "%", spaces) is %-escaped.
SAFE = "._:@+=-"


def placeholders(path: str) -> list[str]:
    """The placeholder names of a path, in order."""
    return PLACEHOLDER.findall(path)


def fill(path: str, **ids: str) -> str:
    """``path`` with each placeholder replaced by its id, URL-quoted; every placeholder
    needs an id and every id a placeholder."""
    names = placeholders(path)
    if set(names) != set(ids):
        raise ValueError(f"{path} takes the ids {sorted(names)}, not {sorted(ids)}")
    return PLACEHOLDER.sub(lambda m: quote(ids[m.group(1)], safe=SAFE), path)
