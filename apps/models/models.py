"""Model registry: models, immutable versions, pools, endpoints and routes.

The app label is ``registry`` (``apps.models.models`` would otherwise clash with Django's
``models`` vocabulary in migrations and admin URLs).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.validators import MinValueValidator
from django.db import models


class Model(models.Model):
    class Task(models.TextChoices):
        CHAT = "chat", "Chat"
        COMPLETION = "completion", "Completion"
        EMBEDDING = "embedding", "Embedding"
        CLASSIFICATION = "classification", "Classification"

    name = models.CharField(max_length=100, unique=True)
    task = models.CharField(max_length=20, choices=Task.choices)
    description = models.TextField(blank=True)
    refused_fields = models.JSONField(
        default=list,
        blank=True,
        help_text="Request fields the router refuses for this model with a 400 "
        'unsupported_parameter, e.g. ["logit_bias", "guided_json"]. Empty: forward all.',
    )
    cache_enabled = models.BooleanField(
        default=True, help_text="Serve deterministic requests from the result cache."
    )
    cache_shared = models.BooleanField(
        default=False,
        help_text="Share cached results across tenants (off: each tenant has its own).",
    )
    cache_ttl_s = models.PositiveIntegerField(
        default=3600, help_text="How long a cached result is kept, in seconds."
    )
    fallback = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="fallback_for",
        help_text="A smaller model of the same task that a pool's 'fallback' degradation moves "
        "requests to when this one's pool is saturated or its breakers are open.",
    )
    members = models.JSONField(
        default=list,
        blank=True,
        help_text="An alias (e.g. a family name): the names of the models of its task it "
        "resolves to, per request the cheapest that fits. An alias has no versions.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["name"]

    def __str__(self) -> str:
        return self.name


class TrustedKey(models.Model):
    """An Ed25519 public key whose artifact signatures workers accept while it is active
    (runtime.signing: what is signed and how keys are encoded)."""

    name = models.SlugField(max_length=63, unique=True, help_text="The key id signatures name.")
    public_key = models.CharField(
        max_length=44,
        unique=True,
        help_text="Base64 of the 32 raw bytes of the Ed25519 public key (a PEM is accepted and "
        "converted).",
    )
    active = models.BooleanField(
        default=True, help_text="Workers refuse signatures by an inactive key at their next start."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One build of a model. Immutable once ``published_at`` is set."""

    class Runtime(models.TextChoices):
        VLLM = "vllm", "vLLM"
        TORCH = "torch", "PyTorch"
        SIMULATOR = "simulator", "Simulator"

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    label = models.CharField(max_length=64)
    artifact_uri = models.CharField(max_length=500)
    digest = models.CharField(max_length=64, help_text="sha256 (hex) of the artifact manifest.")
    manifest = models.JSONField(
        default=dict,
        help_text="tokenizer, max_context, default_sampling and per-file sha256 digests.",
    )
    runtime = models.CharField(max_length=16, choices=Runtime.choices)
    memory_gb = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    tensor_parallel_size = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)]
    )
    capabilities = models.JSONField(
        default=list,
        blank=True,
        help_text='What this build can do, for model aliases: any of "json_output", "tools", '
        '"vision".',
    )
    base_version = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="adapters",
        help_text="A LoRA adapter: the base version whose replicas load it (empty: a full "
        "model). The artifact is the adapter's weights and config.",
    )
    published_at = models.DateTimeField(null=True, blank=True)
    signature = models.CharField(
        max_length=88,
        blank=True,
        default="",
        help_text="Base64 Ed25519 signature over the digest (empty: unsigned).",
    )
    signing_key = models.ForeignKey(
        TrustedKey,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="signed_versions",
        help_text="The trusted key that made the signature.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["model__name", "created_at"]
        constraints: ClassVar[list[Any]] = [
            models.UniqueConstraint(fields=["model", "label"], name="modelversion_unique_label"),
            models.CheckConstraint(
                condition=models.Q(tensor_parallel_size__gte=1) & models.Q(memory_gb__gte=0),
                name="modelversion_resources_valid",
            ),
            models.CheckConstraint(
                condition=(models.Q(signature="") & models.Q(signing_key__isnull=True))
                | (~models.Q(signature="") & models.Q(signing_key__isnull=False)),
                name="modelversion_signature_with_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}:{self.label}"

    @property
    def is_published(self) -> bool:
        return self.published_at is not None

    @property
    def is_adapter(self) -> bool:
        return self.base_version_id is not None


class Pool(models.Model):
    """A group of interchangeable replicas on one hardware tier."""

    name = models.SlugField(max_length=63, unique=True)
    hardware_tier = models.CharField(max_length=32, help_text="e.g. h100, a10, cpu")
    cost_per_replica_hour = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    min_replicas = models.PositiveIntegerField(default=0)
    max_replicas = models.PositiveIntegerField(default=1)
    warm_replicas = models.PositiveIntegerField(default=0)
    policies = models.JSONField(
        default=dict,
        blank=True,
        help_text='Scheduling policy names by interface, e.g. {"fairness": "vtc"}.',
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["name"]
        constraints: ClassVar[list[Any]] = [
            models.CheckConstraint(
                condition=models.Q(min_replicas__lte=models.F("max_replicas"))
                & models.Q(warm_replicas__lte=models.F("max_replicas"))
                & models.Q(cost_per_replica_hour__gte=0),
                name="pool_replicas_ordered",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Endpoint(models.Model):
    """A running replica: one base URL serving one version in one pool."""

    class State(models.TextChoices):
        STARTING = "starting", "Starting"
        READY = "ready", "Ready"
        DRAINING = "draining", "Draining"
        GONE = "gone", "Gone"

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="endpoints")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="endpoints")
    # Not a URLField: its validator refuses single-label hosts such as a Kubernetes service
    # ("http://vllm-0:8000"); the registry service checks the URL (apps.models.validators).
    base_url = models.CharField(max_length=300)
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    capacity = models.PositiveIntegerField(
        default=8, validators=[MinValueValidator(1)], help_text="Concurrent sequences."
    )
    kv_events_url = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="Where the engine publishes its KV cache events (tcp://host:port); empty: "
        "none (routers score its prefixes approximately).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["pool__name", "id"]
        constraints: ClassVar[list[Any]] = [
            models.CheckConstraint(
                condition=models.Q(capacity__gt=0), name="endpoint_capacity_pos"
            ),
            models.UniqueConstraint(
                fields=["base_url"],
                condition=~models.Q(state="gone"),
                name="endpoint_unique_live_url",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.base_url} ({self.state})"


class Route(models.Model):
    """How a model's traffic is split across its versions."""

    class StickyKey(models.TextChoices):
        TENANT = "tenant", "Tenant"
        USER = "user", "User"
        NONE = "none", "None"

    model = models.OneToOneField(Model, on_delete=models.CASCADE, related_name="route")
    sticky_key = models.CharField(
        max_length=16, choices=StickyKey.choices, default=StickyKey.TENANT
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"route:{self.model.name}"


class RouteSplit(models.Model):
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="splits")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    weight = models.PositiveIntegerField(validators=[MinValueValidator(1)])

    class Meta:
        constraints: ClassVar[list[Any]] = [
            models.UniqueConstraint(fields=["route", "version"], name="routesplit_unique_version"),
            models.CheckConstraint(condition=models.Q(weight__gt=0), name="routesplit_weight_pos"),
        ]

    def __str__(self) -> str:
        return f"{self.version_id}:{self.weight}"
