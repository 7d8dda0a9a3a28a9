"""The HTTP contract of history, lineage and corrections (SPEC §4 audit, §7).

A memory's versions with their lineage (which job, which session and messages, which
model and prompt, which actor), the source messages while the session window still holds
them, a user's change log, and the corrections (delete, rollback, undo a job), which are
jobs of the user like any other write: the answer says what was applied.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from memstream.contract.http_api.api import MemoryOut, WindowMessage, _Body, _Out


class VersionLineage(_Out):
    """Where one version came from."""

    kind: str  # extraction | tool | reflection | consolidation | decay | deletion | rollback
    job_id: str
    op_id: str
    session_id: str
    from_seq: int
    to_seq: int
    message_ids: list[str] = Field(default_factory=list)  # or the tool call / request id
    reason: str = ""  # why this version exists (the decision's reason)
    trigger: str = ""  # what triggered its job: threshold | explicit | session_end | idle | tool
    closed_by_job: str | None = None  # the job whose op closed this version


class VersionOut(MemoryOut):
    lineage: VersionLineage


class HistoryResponse(_Out):
    memory_id: str
    versions: list[VersionOut]  # oldest first


class SourceResponse(_Out):
    """The messages one version was extracted from, while the session window keeps them."""

    memory_id: str
    version: int
    session_id: str
    from_seq: int
    to_seq: int
    message_ids: list[str]
    messages: list[WindowMessage]  # those still retained (may be fewer, or none)
    retained: bool  # every message of the range is still here


class ChangePage(_Out):
    """A user's change log, newest first: every version record, opened or closed."""

    changes: list[VersionOut]
    next_cursor: str | None = None


class CorrectionRequest(_Body):
    reason: str = Field("", max_length=500, description="Why (kept in the audit; no content)")
    wait_s: float = Field(10.0, ge=0, le=30, description="Wait this long for apply")


class RollbackRequest(CorrectionRequest):
    version: int = Field(ge=1)


class AppliedChange(_Out):
    op: str
    memory_id: str
    version: int
    content: str


class CorrectionResult(_Out):
    status: Literal["done", "queued", "failed"]
    job_id: str
    changes: list[AppliedChange] = Field(default_factory=list)
    error: str | None = None  # what could not be done (e.g. "no version 7")


class Residue(_Out):
    """What the store still holds of a user (counts only; forget-me verification)."""

    store_records: int  # version records and hit statistics (the fencing cursor excluded)


class AuditEntry(_Out):
    """Who did what, when (never content)."""

    at: float
    op: str  # add | update | delete | erase
    user_id: str
    memory_id: str  # "*" for an erasure
    version: int
    kind: str  # extraction | tool | reflection | consolidation | decay | deletion | ...
    actor: str | None = None  # the API key that asked, or job:<kind>
    job_id: str
    change_id: str
    reason: str | None = None  # a forget-me's "why" only
    version_records: int | None = None  # a forget-me: how many version records it erased


class AuditPage(_Out):
    entries: list[AuditEntry]  # newest first
    next_cursor: str | None = None
