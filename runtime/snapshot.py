"""The runtime snapshot: everything the data plane needs, as one immutable, versioned document.

The control plane builds it from PostgreSQL (``apps.core.selectors.snapshot_build``) and
publishes it to Redis; routers load it with :class:`runtime.snapshot_loader.SnapshotLoader`.
This module is the schema, defined once. It imports nothing from Django.

Fields whose empty value has a meaning (no default class, no expiry, the default policies, an
unknown context size, no discount) default to it, so a builder names only what it sets; fields
whose zero would be a silent mistake (limits, deadlines, capacities) stay required. Defaults
do not change the wire: every field is always encoded, and old documents still decode.

Maps are keyed by their natural key (tenant slug, class name, model name, pool name,
endpoint id, API-key prefix) so the request path does one dict lookup per fact.

Invariants the builder keeps (so the data plane can rely on them):

- every model in ``models`` has at least one published version; ``ModelSnap.versions`` lists
  them oldest → newest published, and every id there is a key of ``versions``;
- a model with no entry in ``routes`` sends all traffic to its newest published version
  (``ModelSnap.versions[-1]``); route splits, endpoints and prices only name versions that
  are in ``versions``;
- API keys are never revoked ones; expired ones are included with ``expires_at`` so the
  gateway can answer "expired" rather than "unknown key";
- endpoints in state "gone" are left out.
"""

from __future__ import annotations

import hashlib

import msgspec

SCHEMA_VERSION = 1
# What a version may declare it can do (``VersionSnap.capabilities``), read by model aliases
# (:mod:`runtime.gateway.aliases`) and checked where a version is written.
CAPABILITIES = ("json_output", "tools", "vision")


class TenantLimits(msgspec.Struct, frozen=True, kw_only=True):
    rpm: int
    tpm: int
    max_concurrency: int
    max_context_tokens: int
    max_output_tokens: int


class TenantSnap(msgspec.Struct, frozen=True, kw_only=True):
    slug: str
    name: str
    status: str = "active"  # "active" | "suspended"
    weight: float = 1.0
    limits: TenantLimits
    classes: tuple[str, ...] = ()  # entitled classes, most urgent first; empty = none
    default_class: str = ""  # "" when the tenant has none
    models: tuple[str, ...] = ()  # model names the tenant may use; empty = every model
    max_request_bytes: int = 0  # request body cap; 0 = only the router's own cap
    result_cache: bool = True  # False: the tenant opted out of the result cache
    zero_retention: bool = False  # True: nothing of its requests kept (no cache, no records)


class ApiKeySnap(msgspec.Struct, frozen=True, kw_only=True):
    prefix: str
    digest: str  # hex sha256 of the full key
    tenant: str  # tenant slug
    name: str = ""
    scopes: tuple[str, ...] = ("inference",)
    expires_at: float | None = None  # unix seconds; None = never
    batch: bool = False  # a Batch API executor's key (minted per batch): its lines are batch


class RequestClassSnap(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    priority_band: int  # 0 is the most urgent
    ttft_slo_ms: int
    deadline_ms: int
    max_queue_length: int
    shed_order: int  # shed lower numbers first under overload
    heartbeat_ms: int = 5000  # ': queued' comments to a waiting stream (0: off; <= 5000)
    itl_slo_ms: int = 200  # the objective for a stream's p95 inter-token latency


SamplingValue = bool | int | float | str | tuple[str, ...] | None
"""A default sampling parameter: a number, a flag, a string or a list of stop strings."""


class VersionSnap(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    model: str
    label: str
    artifact_uri: str = ""
    digest: str = ""
    runtime: str  # "vllm" | "torch" | "simulator"
    max_context: int = 0  # 0 when the manifest does not say
    tokenizer: str = ""  # "" when the manifest does not say
    default_sampling: dict[str, SamplingValue] = {}
    memory_gb: float = 0.0
    tensor_parallel_size: int = 1
    # Scale from zero (apps/scaling): the pool that starts a replica of this version when none
    # is ready ("" = none), and its measured start time in seconds.
    scale_pool: str = ""
    cold_start_s: float = 0.0
    # What the build declares it can do (:data:`CAPABILITIES`): a model alias picks only a
    # version that has what a request needs.
    capabilities: tuple[str, ...] = ()
    # A LoRA adapter: the base version whose replicas load it (None: a full model) and the
    # name the engine knows it by (:func:`adapter_name`); it has no endpoints of its own.
    base_version: int | None = None
    lora_rank: int = 0
    # An adapter's signature over its digest and the name of the key that made it ("":
    # unsigned); the router checks it before a load it triggers (:class:`SigningSnap`).
    signature: str = ""
    signing_key: str = ""


def adapter_name(version: VersionSnap) -> str:
    """The name an engine serves an adapter version under (``/v1/load_lora_adapter``'s
    ``lora_name``, the upstream body's ``model``): one per version, so two versions of one
    adapter (a canary) can be resident side by side."""
    return f"{version.model}@{version.label}"


class CachePolicySnap(msgspec.Struct, frozen=True, kw_only=True):
    """Whether deterministic results of a model may be cached, for how long, and shared how."""

    enabled: bool = True
    shared: bool = False  # False: entries are scoped to the tenant
    ttl_s: int = 3600


class ModelSnap(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    task: str  # "chat" | "completion" | "embedding" | "classification"
    versions: tuple[int, ...]  # published version ids, oldest -> newest published
    cache: CachePolicySnap = CachePolicySnap()
    refused_fields: tuple[str, ...] = ()  # request fields answered 400 unsupported_parameter
    fallback: str = ""  # the smaller model a ``fallback`` degradation moves requests to


class AliasSnap(msgspec.Struct, frozen=True, kw_only=True):
    """A model alias (e.g. a family name): each request goes to the cheapest member whose
    version fits it (context, capabilities); ``members`` are model names of ``task``, in the
    operator's order (the tie-break)."""

    name: str
    task: str
    members: tuple[str, ...]


class PoolSnap(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    hardware_tier: str
    cost_per_replica_hour: float = 0.0
    min_replicas: int = 0
    max_replicas: int
    warm_replicas: int = 0
    policies: dict[str, str] = {}  # key -> name or parameter; empty = the defaults


class EndpointSnap(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    pool: str
    version: int
    base_url: str
    state: str  # "starting" | "ready" | "draining" | "gone"
    capacity: int
    kv_events: str = ""  # tcp://host:port of its engine's KV events (runtime.routing.kv_subscriber)


class RouteSplit(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    weight: int


class RouteSnap(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    splits: tuple[RouteSplit, ...]
    sticky_key: str = "tenant"  # "tenant" | "user" | "none"
    sticky_header: str = ""  # a rollout's header name (lower-case): its value is the key
    shadow_version: int | None = None
    shadow_share: float = 0.0
    # A running rollout's blast-radius limit: these tenants always get ``stable_version``.
    stable_version: int | None = None
    exclude_tenants: tuple[str, ...] = ()


class PriceSnap(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    hardware_tier: str
    input_per_1k: float
    output_per_1k: float
    cache_hit_discount: float = 0.0  # fraction off, 0..1
    batch_discount: float = 0.0  # fraction off a Batch API line (its key is ``batch``), 0..1


class CreditSnap(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's credit settings (its balance lives in Redis, not here)."""

    overdraft: str = "refuse"  # "refuse": 402 when short; "batch": lowest band, best effort
    day_cap: float | None = None  # hard budget caps in credits; None = no cap
    month_cap: float | None = None


class SafetyRuleSnap(msgspec.Struct, frozen=True, kw_only=True):
    """One rule of a policy pack (validated where written: ``runtime.safety.rules``).

    ``kind`` says what it matches: ``terms`` (blocked words or phrases), ``regex`` (patterns),
    ``pii`` (named detectors: email, phone, credit_card, iban, us_ssn, ipv4) or ``classifier``
    (a registered model's score against ``threshold``). ``action`` says what a match does:
    ``refuse`` or ``redact`` on the input, ``stop`` on the output stream.
    """

    id: str  # the rule's name inside its pack; what a refusal or an event names
    kind: str  # "terms" | "regex" | "pii" | "classifier"
    action: str  # "refuse" | "redact" (input) | "stop" (output)
    terms: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    detectors: tuple[str, ...] = ()
    case_sensitive: bool = False  # terms only; patterns match as written (use (?i:...))
    max_len: int = 0  # regex: the longest match caught across chunks; 0 = the pattern's, or 64
    model: str = ""  # classifier: a model name in the registry
    threshold: float = 0.5  # classifier: a score at or above it matches
    fail_open: bool = False  # classifier down: True lets the request through, False refuses


class PolicyPackSnap(msgspec.Struct, frozen=True, kw_only=True):
    """A named, versioned set of safety rules; a new version is a new document."""

    name: str
    version: int
    rules: tuple[SafetyRuleSnap, ...] = ()


class SafetySnap(msgspec.Struct, frozen=True, kw_only=True):
    """The policy packs and who they apply to; a request gets its tenant's and its model's."""

    packs: dict[str, PolicyPackSnap] = {}  # pack name -> its published version
    tenants: dict[str, tuple[str, ...]] = {}  # tenant slug -> pack names
    models: dict[str, tuple[str, ...]] = {}  # model name -> pack names


class SigningSnap(msgspec.Struct, frozen=True, kw_only=True):
    """What a router checks an adapter's signature with before loading it on a replica
    (:mod:`runtime.signing`, the same rule as a worker's): whether unsigned adapters are
    refused, and the registry's active public keys by name. Empty without adapters."""

    required: bool = False
    trusted: dict[str, str] = {}


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    created_at: float
    schema: int = SCHEMA_VERSION
    tenants: dict[str, TenantSnap] = {}
    api_keys: dict[str, ApiKeySnap] = {}
    classes: dict[str, RequestClassSnap] = {}
    models: dict[str, ModelSnap] = {}
    versions: dict[int, VersionSnap] = {}
    pools: dict[str, PoolSnap] = {}
    endpoints: dict[int, EndpointSnap] = {}
    routes: dict[str, RouteSnap] = {}
    prices: tuple[PriceSnap, ...] = ()
    credits: dict[str, CreditSnap] = {}  # tenant slug -> credit settings; absent = defaults
    safety: SafetySnap = SafetySnap()  # policy packs; absent (older documents) = none
    aliases: dict[str, AliasSnap] = {}  # alias name -> its members; never a model's name
    signing: SigningSnap = SigningSnap()  # adapter signatures (absent: no adapters)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Snapshot)


def encode(snapshot: Snapshot) -> bytes:
    """Serialise a snapshot to canonical JSON bytes."""
    return _ENCODER.encode(snapshot)


def decode(raw: bytes | str) -> Snapshot:
    """Parse and validate snapshot JSON; raises ``msgspec.ValidationError`` on a bad document."""
    return _DECODER.decode(raw)


def with_version(snapshot: Snapshot, version: int) -> Snapshot:
    """Return a copy of ``snapshot`` stamped with ``version``."""
    return msgspec.structs.replace(snapshot, version=version)


def content_digest(snapshot: Snapshot) -> str:
    """sha256 (hex) of what the snapshot says, ignoring its ``version`` and ``created_at``.

    Two snapshots built from the same database state have the same digest, so a periodic
    refresh can tell whether anything changed since the last publish.
    """
    bare = msgspec.structs.replace(snapshot, version=0, created_at=0.0)
    canonical = msgspec.json.encode(msgspec.to_builtins(bare, str_keys=True), order="sorted")
    return hashlib.sha256(canonical).hexdigest()
