"""Django settings, read from the environment (12-factor).

DATABASE_URL, REDIS_URL, SECRET_KEY (required outside DEBUG; `up` generates one into the var
directory), DEBUG and ALLOWED_HOSTS are the knobs; everything else has a default that works on
one machine. `switchyard up` and the test command fill in DATABASE_URL/REDIS_URL with embedded
servers when they are unset.
"""

import os
from pathlib import Path

import dj_database_url

from config import batch_storage, redis_sentinel, secret_key
from config.paths import default_var_dir
from runtime import contract

BASE_DIR = Path(__file__).resolve().parent.parent  # the checkout, or site-packages when installed
VAR_DIR = default_var_dir(os.environ)


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("DEBUG", default=False)
# SECRET_KEY / SECRET_KEY_FILE, else the key `up` generated into VAR_DIR; outside DEBUG none of
# them leaves it empty and the web, Celery and manage.py refuse to start with SECRET_KEY_PROBLEM
# (config/secret_key.py), never a public default.
SECRET_KEY, SECRET_KEY_PROBLEM = secret_key.settings_key(os.environ, VAR_DIR, debug=DEBUG)
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")
]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "apps.common",
    "apps.core",
    "apps.tenants",
    "apps.models",
    "apps.rollouts",
    "apps.billing",
    "apps.scaling",
    "apps.safety",
    "apps.batches",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Django's psycopg pool per process (Django documents persistent connections, CONN_MAX_AGE, as
# unsupported under ASGI: they leak): SWITCHYARD_DB_POOL_MAX connections at most per process
# (default 8; web, each Celery worker process), a request waits up to SWITCHYARD_DB_POOL_TIMEOUT_S
# (10) for one. SWITCHYARD_DB_POOL=0: no pool, a connection per request (e.g. behind PgBouncer).
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/switchyard"),
        conn_max_age=0,
    )
}
if _env_bool("SWITCHYARD_DB_POOL", default=True):
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": int(os.environ.get("SWITCHYARD_DB_POOL_MAX", "8")),
        "timeout": float(os.environ.get("SWITCHYARD_DB_POOL_TIMEOUT_S", "10")),
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# REDIS_URL may name the primary through Sentinel: redis+sentinel://host:port,host:port/<master>
# [/<db>] (runtime/redis_conn.py); the cache, Celery and the channel layer follow it
# (config/redis_sentinel.py translates it for each).
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
_CACHE_URL = os.environ.get("SWITCHYARD_CACHE_URL", REDIS_URL)

# One cache for every control-plane process (REST throttles are global), in Redis under
# "<namespace>:django"; its clear() deletes only those keys (config/cache.py).
CACHES = {
    "default": {
        "BACKEND": "config.cache.NamespacedRedisCache",
        **redis_sentinel.cache_location(_CACHE_URL),
        "KEY_PREFIX": contract.namespace_of(
            os.environ.get(contract.ENV_SNAPSHOT_PREFIX, contract.SNAPSHOT_PREFIX)
        )
        + ":django",
    }
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [redis_sentinel.channels_host(REDIS_URL)]},
    }
}

_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
_RESULT_URL = os.environ.get("CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_BROKER_URL = redis_sentinel.celery_url(_BROKER_URL)
CELERY_RESULT_BACKEND = redis_sentinel.celery_url(_RESULT_URL)
CELERY_BROKER_TRANSPORT_OPTIONS = redis_sentinel.celery_transport_options(_BROKER_URL)
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = redis_sentinel.celery_transport_options(_RESULT_URL)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Any number of beat processes; the one holding a Redis lease schedules (config/beat_lock.py:
# failover within SWITCHYARD_BEAT_LEASE_S, default 10 s, + 1 s; heartbeat for the alert).
CELERY_BEAT_SCHEDULER = "config.beat_lock:LeasedScheduler"
_BATCH_TICK_S = float(os.environ.get("SWITCHYARD_BATCH_TICK_S", "2"))
_BATCH_BILL_EVERY_S = float(os.environ.get("SWITCHYARD_BATCH_BILL_EVERY_S", "30"))
CELERY_BEAT_SCHEDULE = {
    "drain-snapshot-outbox": {  # retries failed publishes (revocations, suspensions, ...)
        "task": "apps.core.tasks.snapshot_outbox_drain",
        "schedule": float(os.environ.get("SWITCHYARD_SNAPSHOT_OUTBOX_RETRY_S", "2")),
        "options": {"expires": 10.0},
    },
    "republish-snapshot-if-changed": {
        "task": "apps.core.tasks.snapshot_refresh",
        "schedule": 30.0,
    },
    "copy-api-key-last-use": {
        "task": "apps.tenants.tasks.api_keys_sync_last_used",
        "schedule": 15.0,
    },
    "reap-endpoints-without-heartbeat": {
        "task": "apps.models.tasks.endpoints_reap_stale",
        "schedule": 15.0,
    },
    "usage-stream-to-ledger": {"task": "apps.billing.tasks.usage_consume", "schedule": 1.0},
    "safety-stream-to-audit": {"task": "apps.safety.tasks.interventions_consume", "schedule": 1.0},
    "reconcile-credit-balances": {"task": "apps.billing.tasks.credit_reconcile", "schedule": 30.0},
    "evaluate-rollout-gates": {
        "task": "apps.rollouts.tasks.rollouts_evaluate",
        "schedule": float(os.environ.get("SWITCHYARD_ROLLOUT_EVALUATE_S", "2")),
    },
    "autoscale-pools": {"task": "apps.scaling.tasks.autoscale_tick", "schedule": 5.0},
    # A batch tick still queued two intervals (at least 5 s) after beat sent it has newer ones
    # behind it: it expires, so a worker slower than the schedule (a long tick, a loaded
    # machine) does not pile stale ticks up in front of every other periodic task (the usage
    # consumer's among). The expiry is beat's clock against the worker's: hosts whose clocks
    # differ by more than that would drop every tick (keep them in sync, as NTP does).
    "run-batches": {
        "task": "apps.batches.tasks.batches_tick",
        "schedule": _BATCH_TICK_S,
        "options": {"expires": max(5.0, 2 * _BATCH_TICK_S)},
    },
    "bill-batch-lines": {
        "task": "apps.batches.tasks.batch_lines_bill",
        "schedule": _BATCH_BILL_EVERY_S,
        "options": {"expires": max(5.0, 2 * _BATCH_BILL_EVERY_S)},
    },
}
# Retention (apps/common/retention.py): days each table keeps its rows (0: forever), applied by
# beat in bounded batches; the audit log is archived (gzipped JSON lines) before deletion.
RETENTION_DAYS = {
    "usage": float(os.environ.get("SWITCHYARD_RETENTION_USAGE_DAYS", "400")),
    "audit": float(os.environ.get("SWITCHYARD_RETENTION_AUDIT_DAYS", "400")),
    "scaling_decisions": float(os.environ.get("SWITCHYARD_RETENTION_SCALING_DAYS", "14")),
    "rollout_events": float(os.environ.get("SWITCHYARD_RETENTION_ROLLOUT_EVENTS_DAYS", "400")),
    "budget_alerts": float(os.environ.get("SWITCHYARD_RETENTION_BUDGET_ALERTS_DAYS", "400")),
}
RETENTION_BATCH_ROWS = int(os.environ.get("SWITCHYARD_RETENTION_BATCH_ROWS", "5000"))
RETENTION_MAX_BATCHES = int(os.environ.get("SWITCHYARD_RETENTION_MAX_BATCHES", "20"))
RETENTION_ARCHIVE_DIR = Path(
    os.environ.get("SWITCHYARD_RETENTION_ARCHIVE_DIR", str(VAR_DIR / "archive"))
)
CELERY_BEAT_SCHEDULE["apply-retention"] = {
    "task": "apps.common.tasks.retention_apply",
    "schedule": float(os.environ.get("SWITCHYARD_RETENTION_EVERY_S", "3600")),
}
# SWITCHYARD_BEAT_ONLY="name,name": beat sends only these entries (a test's private beat).
_BEAT_ONLY = {name for name in os.environ.get("SWITCHYARD_BEAT_ONLY", "").split(",") if name}
if _BEAT_ONLY:
    CELERY_BEAT_SCHEDULE = {k: v for k, v in CELERY_BEAT_SCHEDULE.items() if k in _BEAT_ONLY}

# A rollout's warm-up (digest, replica start, warm-up requests) must finish within this.
ROLLOUT_WARMUP_TIMEOUT_S = float(os.environ.get("SWITCHYARD_ROLLOUT_WARMUP_TIMEOUT_S", "180"))

# Routers record API-key last use in this Redis hash (prefix -> unix time); beat copies it.
API_KEY_USAGE_HASH = os.environ.get(contract.ENV_KEY_USAGE_HASH, contract.KEY_USAGE_HASH)

# The runtime snapshot (docs/design.md).
SNAPSHOT_REDIS_PREFIX = os.environ.get(contract.ENV_SNAPSHOT_PREFIX, contract.SNAPSHOT_PREFIX)
SNAPSHOT_KEEP_VERSIONS = 20

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The collected static files: the var directory's staticfiles/ (collectstatic, `up`), or
# SWITCHYARD_STATIC_ROOT (the container image collects them at build time into its own root).
STATIC_ROOT = Path(os.environ.get("SWITCHYARD_STATIC_ROOT", "") or VAR_DIR / "staticfiles")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    # The Batch API's files (apps/batches): local files under VAR_DIR/batch-files, or an
    # S3-compatible store by SWITCHYARD_BATCH_STORAGE=s3://bucket/prefix (config/batch_storage.py)
    "batches": batch_storage.from_env(os.environ, VAR_DIR),
}

# Encryption at rest of the Batch API's files (apps/batches/sealing.py): the router's keyring
# (SWITCHYARD_AT_REST_KEYS, else the file SWITCHYARD_AT_REST_KEYS_FILE names, else
# VAR_DIR/at_rest_keys), so one rotation covers the router's cache and the stored files.
AT_REST_KEYS = os.environ.get("SWITCHYARD_AT_REST_KEYS", "")
AT_REST_KEYS_FILE = os.environ.get("SWITCHYARD_AT_REST_KEYS_FILE", "")

# Model artifact signatures (runtime/signing.py): "required" (workers refuse an unsigned
# version) or "optional" (unsigned versions are served with a warning). Either way a present
# signature must verify against a key the registry trusts.
ARTIFACT_SIGNATURES = os.environ.get("SWITCHYARD_ARTIFACT_SIGNATURES", "required")

# The Batch API (apps/batches, docs/user-guide/batch-api.md). The router forwards /v1/files and
# /v1/batches here with the principal it resolved, signed with SWITCHYARD_INTERNAL_SECRET (the
# same value in the router's environment); unsigned, forged or expired requests are refused.
# The executor sends each line to the router at SWITCHYARD_BATCH_ROUTER_URL.
INTERNAL_SECRET = os.environ.get("SWITCHYARD_INTERNAL_SECRET", "")
BATCH_ROUTER_URL = os.environ.get("SWITCHYARD_BATCH_ROUTER_URL", "http://127.0.0.1:8080")
BATCH_MAX_FILE_BYTES = int(os.environ.get("SWITCHYARD_BATCH_MAX_FILE_BYTES", "104857600"))
BATCH_MAX_LINES = int(os.environ.get("SWITCHYARD_BATCH_MAX_LINES", "50000"))
BATCH_LEASE_S = float(os.environ.get("SWITCHYARD_BATCH_LEASE_S", "120"))
BATCH_CLAIM_SIZE = int(os.environ.get("SWITCHYARD_BATCH_CLAIM_SIZE", "32"))
BATCH_CLASS = os.environ.get("SWITCHYARD_BATCH_CLASS", "batch")
# A done batch line whose usage event has not reached the ledger this many seconds after it
# finished (and is not waiting in the usage stream) is charged from its recorded usage.
BATCH_BILL_GRACE_S = float(os.environ.get("SWITCHYARD_BATCH_BILL_GRACE_S", "120"))
# A zero_retention tenant's batch output and error files are deleted once downloaded, or this
# many seconds after the batch ends when nobody downloads them.
BATCH_ZERO_RETENTION_OUTPUT_S = float(
    os.environ.get("SWITCHYARD_BATCH_ZERO_RETENTION_OUTPUT_S", "3600")
)

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
# HTTPS (runtime/tls.py; docs/operations/tls.md): with SWITCHYARD_TLS_CERT/SWITCHYARD_TLS_KEY set
# the web process serves TLS (the Procfile's uvicorn line), cookies are Secure (SECURE_COOKIES
# overrides either way) and responses carry HSTS for SWITCHYARD_HSTS_SECONDS (default a year;
# `up --tls` an hour; 0: none). Behind a TLS-terminating proxy set SECURE_COOKIES=1,
# SWITCHYARD_HSTS_SECONDS and SWITCHYARD_TRUST_X_FORWARDED_PROTO=1 instead.
TLS_ON = bool(os.environ.get("SWITCHYARD_TLS_CERT", "").strip())  # runtime/tls.py
SESSION_COOKIE_SECURE = _env_bool("SECURE_COOKIES", default=TLS_ON)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = int(os.environ.get("SWITCHYARD_HSTS_SECONDS") or (31536000 if TLS_ON else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SWITCHYARD_HSTS_INCLUDE_SUBDOMAINS", default=False)
if _env_bool("SWITCHYARD_TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# The REST API (README "REST API"): session or management-token auth, one error shape,
# cursor pagination, a throttle bucket per credential; OpenAPI at /api/schema/, docs /api/docs/.
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.tenants.api_auth.ManagementTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "apps.common.api_support.IdCursorPagination",
    "DEFAULT_THROTTLE_CLASSES": ["apps.common.api_support.CredentialThrottle"],
    "DEFAULT_THROTTLE_RATES": {"api": os.environ.get("SWITCHYARD_API_RATE", "600/min")},
    "EXCEPTION_HANDLER": "apps.common.api_support.api_exception_handler",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchyard control plane",
    "DESCRIPTION": (
        "Tenant self-service under /api/v1/tenants/{tenant}/ (a member's session or a "
        "management token) and operator endpoints under /api/v1/ops/ (staff sessions). "
        'Errors: {"error": {"code", "message", "fields"}}. Updates (PATCH) need '
        "If-Match with the ETag of your last read: 428 without it, 412 when stale."
    ),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "EndpointStateEnum": "apps.models.models.Endpoint.State",
        "RolloutStateEnum": "apps.rollouts.models.Rollout.State",
        "BatchStatusEnum": "apps.batches.models.Batch.Status",
        "TenantStatusEnum": "apps.tenants.models.Tenant.Status",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.common.api_support.error_responses_hook",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
