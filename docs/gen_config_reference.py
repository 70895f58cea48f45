"""Writes docs/reference/configuration.md from the environment variables the code reads.

The variables are found by reading the sources (``ast``, nothing is imported or run): every
``os.environ.get(NAME, default)``, ``os.getenv(NAME, default)``, ``env.get(NAME) or default``
and the settings' helpers ``_env_bool(NAME, default=...)`` / ``_number(env, NAME, default, ...)``.
A name or default given as a module constant (``ENV_ACTUATOR``, ``contract.SNAPSHOT_PREFIX``)
is resolved from the module's own constants or ``runtime/contract.py``'s.

    python docs/gen_config_reference.py           # rewrite the page
    python docs/gen_config_reference.py --check   # exit 1 when the committed page is stale

``tests/docs/test_config_reference.py`` runs the check, so the page cannot go stale: a new
variable in one of the SOURCES appears in the table the next time this script runs; give it a
line in MEANINGS.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "configuration.md"
CONTRACT = "runtime/contract.py"
# (glob, who reads it): every module of config/ (settings and what `up` runs), the router's
# settings, the contract both halves share, the autoscaler's actuator choice.
SOURCES: tuple[tuple[str, str], ...] = (
    ("config/*.py", "control plane"),
    ("runtime/gateway/config.py", "router"),
    (CONTRACT, "both halves (the Redis key layout)"),
    ("apps/scaling/tasks.py", "autoscaler (Celery)"),
    ("runtime/tls.py", "router, workers, control plane (TLS)"),
)
# Modules of the SOURCES that are not a process's settings (the test session's plugin).
SKIPPED: frozenset[str] = frozenset({"config/pytest_env.py"})
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
ENV_MAPPINGS = {"environ", "env"}  # os.environ.get(...), env.get(...) on a Mapping of the env

# What each variable means; a variable without a line here shows "(undocumented)".
MEANINGS: dict[str, str] = {
    "ALLOWED_HOSTS": "comma-separated host names the control plane answers",
    "CELERY_BROKER_URL": "Celery's broker (defaults to `REDIS_URL`; a `redis+sentinel://` URL "
    "works)",
    "CELERY_RESULT_BACKEND": "Celery's result store (defaults to `REDIS_URL`; a "
    "`redis+sentinel://` URL works)",
    "CSRF_TRUSTED_ORIGINS": "comma-separated origins trusted for CSRF (behind a TLS proxy)",
    "DATABASE_URL": "PostgreSQL URL; `switchyard up` and the test command start an embedded "
    "PostgreSQL when it is unset",
    "DEBUG": "Django debug mode (`1`, `true`, `yes`, `on`)",
    "KUBECONFIG": "the kubeconfig the `kubernetes` scaling actuator uses (in-cluster when unset)",
    "LOG_LEVEL": "the control plane's log level",
    "REDIS_URL": "Redis URL: snapshot, limits, usage stream, Celery broker and results, channel "
    "layer; `redis+sentinel://host:port,host:port/<master>[/<db>]` names the primary through "
    "Sentinel (every client follows a failover); `switchyard up` starts an embedded Redis when "
    "it is unset",
    "SECURE_COOKIES": "session and CSRF cookies only over HTTPS (`1`, `true`, `yes`, `on`)",
    "SECRET_KEY": "Django secret key, required outside `DEBUG`: unset, the processes use "
    "`<SWITCHYARD_VAR_DIR>/secret_key` (which `switchyard up` generates, mode 0600, and keeps); "
    "with neither, the web, Celery and `manage.py` refuse to start naming it",
    "SECRET_KEY_FILE": "a file holding the Django secret key (instead of `SECRET_KEY`)",
    "SWITCHYARD_CACHE_URL": "the control plane's shared Django cache (REST throttles); defaults "
    "to `REDIS_URL`",
    "SWITCHYARD_DB_POOL": "a psycopg connection pool per control-plane process; `0`: a "
    "connection per request (e.g. behind PgBouncer)",
    "SWITCHYARD_DB_POOL_MAX": "connections per control-plane process at most",
    "SWITCHYARD_DB_POOL_TIMEOUT_S": "how long a request waits for a pooled connection",
    "SWITCHYARD_ROUTER_WORKERS": "worker processes of this router (`--workers` sets it); each "
    "worker's share of the limits while Redis is down",
    "SWITCHYARD_ROUTER_HTTP": "the router's HTTP entry: `asgi` (pure ASGI routes, the default) "
    "or `channels` (Channels consumers, kept for the A/B of issue #27; see "
    "[the performance report](../performance/2026-11-26-router-pipeline-cpu.md))",
    "SWITCHYARD_API_RATE": "REST API throttle per credential (Django's rate syntax)",
    "SWITCHYARD_ARTIFACT_SIGNATURES": "`required`: workers refuse a model version without a "
    "signature by a trusted key; `optional`: unsigned versions are served with a warning (a "
    "present signature is still checked); see [Signed artifacts](../operations/signing.md)",
    "SWITCHYARD_ASSUMED_REPLICAS": "router replicas (machines or pods); Redis down: each process "
    "lends a tenant 1/(this x workers) of its limits and of the balance Redis last reported",
    "SWITCHYARD_BEAT_LEASE_S": "how long the scheduling Celery beat's Redis lease outlives its "
    "last renewal: a standby beat takes over within this + 1 s",
    "SWITCHYARD_BATCH_BILL_GRACE_S": "Batch API: seconds after a done line before a usage event "
    "the ledger lacks counts as lost (the line is then charged from its recorded usage)",
    "SWITCHYARD_BATCH_BILL_EVERY_S": "Batch API: how often beat looks for done lines whose usage "
    "event the ledger lacks",
    "SWITCHYARD_BATCH_CLAIM_SIZE": "Batch API: lines one executor tick sends at once",
    "SWITCHYARD_BATCH_CLASS": "Batch API: batch lines' request class (if the tenant has it)",
    "SWITCHYARD_BATCH_LEASE_S": "Batch API: a claimed line's lease (renewed while it runs)",
    "SWITCHYARD_BATCH_MAX_FILE_BYTES": "Batch API: an input file's cap (413 `file_too_large`)",
    "SWITCHYARD_BATCH_CONCURRENCY": "Batch API: a tenant's batch lines in flight at the router "
    "(its batch lane, apart from its online RPM/TPM/concurrency)",
    "SWITCHYARD_BATCH_MAX_LINES": "Batch API: requests in one input file (400 `too_many_lines`)",
    "SWITCHYARD_BATCH_ROUTER_URL": "Batch API: the router the executor sends lines to",
    "SWITCHYARD_BATCH_TICK_S": "Batch API: how often beat runs the executor's tick",
    "SWITCHYARD_BATCH_STORAGE": "Batch API: where files are stored; unset: local files under "
    "the var directory's `batch-files/`; `s3://bucket[/prefix]`: an S3-compatible store "
    "(django-storages, the `s3` extra; credentials from boto3's chain, e.g. "
    "`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`); sealed per tenant either way",
    "SWITCHYARD_BATCH_S3_ENDPOINT_URL": "Batch API, `s3://` storage: the endpoint of a store "
    "other than AWS (MinIO, Ceph, ...; path-style addressing); unset: AWS",
    "SWITCHYARD_BATCH_S3_REGION": "Batch API, `s3://` storage: the bucket's region (unset: "
    "boto3's default)",
    "SWITCHYARD_BATCH_ZERO_RETENTION_OUTPUT_S": "Batch API: a zero_retention tenant's output "
    "and error files are deleted this many seconds after the batch ends when nobody downloads "
    "them",
    "SWITCHYARD_CONTROL_PLANE_URL": "Batch API: where the router forwards files and batches "
    "(`up` sets it; unset: 503 `batch_api_unavailable`)",
    "SWITCHYARD_INTERNAL_SECRET": "Batch API: the secret signing the principal the router "
    "forwards (same value on both sides; `up` makes one per run when unset)",
    "SWITCHYARD_MAX_UPLOAD_BYTES": "Batch API: a file upload's cap at the router "
    "(413 `upload_too_large`)",
    "SWITCHYARD_BEAT_ONLY": "comma-separated beat entry names: beat sends only these (a test's "
    "private beat)",
    "SWITCHYARD_BODY_TIMEOUT_S": "the request head and body must arrive within this (else 408)",
    "SWITCHYARD_CLIENT_WRITE_STALL_S": "a response chunk to a client that stopped reading (its "
    "socket and the router's buffer full) waits at most this long; then the connection is "
    "dropped and the request ends as a disconnect",
    "SWITCHYARD_COALESCE_WINDOW_MS": "unary requests to `torch` versions coalesce this long; 0 "
    "turns router-side coalescing off",
    "SWITCHYARD_CONNECT_TIMEOUT_S": "upstream connect cap per attempt",
    "SWITCHYARD_DEFAULT_BAND": "priority band of a request without a class",
    "SWITCHYARD_DEFAULT_DEADLINE_S": "deadline when the request class gives none",
    "SWITCHYARD_FAIRNESS_PREFIX": "Redis key prefix of the shared fairness counters "
    "(default: *namespace*`:fairness`)",
    "SWITCHYARD_K8S_NAMESPACE": "the namespace the `kubernetes` scaling actuator patches",
    "SWITCHYARD_KEY_USAGE_HASH": "Redis hash of the API keys' last use (both halves)",
    "SWITCHYARD_LIMITS_PREFIX": "Redis key prefix of the tenant limits (default: "
    "*namespace*`:limits`)",
    "SWITCHYARD_MAX_BODY_BYTES": "request body cap (413 `request_too_large` above)",
    "SWITCHYARD_MAX_DEADLINE_S": "no request may ask for a longer deadline",
    "SWITCHYARD_QUEUE_LIMIT": "queue bound of a priority band no class names",
    "SWITCHYARD_RETRY_ATTEMPTS": "upstream attempts before the first byte",
    "SWITCHYARD_STREAM_MIGRATIONS": (
        "a stream whose engine breaks mid-generation resumes on another endpoint at most this "
        "often (user-guide/preemption.md); 0: off"
    ),
    "SWITCHYARD_AT_REST_KEYS": "the keyring that encrypts the router's cache entries and "
    "idempotency records in Redis, and the Batch API's stored files (control plane and "
    "workers): `id:<base64 key>,...`, newest first (it encrypts, all "
    "decrypt); unset: `SWITCHYARD_AT_REST_KEYS_FILE`, else `<SWITCHYARD_VAR_DIR>/at_rest_keys` "
    "(generated by `switchyard up`, or a router that finds none, mode 0600); never logged",
    "SWITCHYARD_AT_REST_KEYS_FILE": "a file holding the at-rest keyring (instead of "
    "`SWITCHYARD_AT_REST_KEYS`)",
    "SWITCHYARD_RETENTION_USAGE_DAYS": "days the usage ledger keeps a row (0: forever; at least "
    "32)",
    "SWITCHYARD_RETENTION_AUDIT_DAYS": "days the audit log keeps a row (0: forever); older rows "
    "are archived to `SWITCHYARD_RETENTION_ARCHIVE_DIR`, then deleted",
    "SWITCHYARD_RETENTION_SCALING_DAYS": "days the autoscaler's decisions are kept (0: forever)",
    "SWITCHYARD_RETENTION_ROLLOUT_EVENTS_DAYS": "days rollout events are kept (0: forever)",
    "SWITCHYARD_RETENTION_BUDGET_ALERTS_DAYS": "days budget alerts are kept (0: forever; at "
    "least 32)",
    "SWITCHYARD_RETENTION_BATCH_ROWS": "rows one retention batch deletes at most, per table",
    "SWITCHYARD_RETENTION_MAX_BATCHES": "batches one retention run deletes at most, per table",
    "SWITCHYARD_RETENTION_ARCHIVE_DIR": "where the audit log's rows are archived (gzipped JSON "
    "lines) before retention deletes them",
    "SWITCHYARD_RETENTION_EVERY_S": "beat interval of the retention task",
    "SWITCHYARD_ROLLOUT_EVALUATE_S": "beat interval of the rollout gates' evaluation",
    "SWITCHYARD_ROLLOUT_WARMUP_TIMEOUT_S": "a rollout's warm-up must finish within this, else "
    "it aborts",
    "SWITCHYARD_SCALING_ACTUATOR": "`local` (what `switchyard up` sets) or `kubernetes`; unset: "
    "autoscaling is off",
    "SWITCHYARD_SCALING_SIGNALS_S": "how often a router measures its pools' scaling signals (a "
    "changed pool is written at once, an unchanged one every third interval)",
    "SWITCHYARD_SETTLE_LINGER_MS": "how long a batch of settlements (usage events, limit refunds) "
    "waits before one Redis pipeline; 0 sends each at once",
    "SWITCHYARD_SNAPSHOT_CONFIRM_POLL_S": "how often a router reads the control plane's "
    "freshness confirmation",
    "SWITCHYARD_SNAPSHOT_OUTBOX_RETRY_S": "beat interval of the snapshot outbox drain",
    "SWITCHYARD_SNAPSHOT_PREFIX": "Redis key prefix of the snapshot; its namespace (the prefix "
    "without `:snapshot`) prefixes every other key",
    "SWITCHYARD_SNAPSHOT_STALE_AFTER_S": "a router reports its snapshot stale past this age",
    "SWITCHYARD_STATIC_ROOT": "where collectstatic writes and the web serves the static files "
    "from (the container image: `/usr/share/switchyard/static`, collected at build time)",
    "SWITCHYARD_TTFT_TIMEOUT_S": "upstream first-byte cap per attempt",
    "SWITCHYARD_TLS_CERT": "PEM certificate (chain) the router and the control plane serve "
    "HTTPS with; turns on Secure cookies and HSTS (docs/operations/tls.md)",
    "SWITCHYARD_TLS_KEY": "the key of `SWITCHYARD_TLS_CERT`",
    "SWITCHYARD_HSTS_SECONDS": "HSTS max-age the control plane sends over HTTPS; 0: no header",
    "SWITCHYARD_HSTS_INCLUDE_SUBDOMAINS": "HSTS covers subdomains too",
    "SWITCHYARD_TRUST_X_FORWARDED_PROTO": "behind a TLS-terminating proxy: trust its "
    "`X-Forwarded-Proto: https`",
    "SWITCHYARD_WORKER_TLS_CERT": "a model worker serves HTTPS with this certificate",
    "SWITCHYARD_WORKER_TLS_KEY": "the key of `SWITCHYARD_WORKER_TLS_CERT`",
    "SWITCHYARD_WORKER_TLS_CLIENT_CA": "a worker requires client certificates signed by this CA "
    "(mTLS)",
    "SWITCHYARD_UPSTREAM_CLIENT": "the router's client for inference requests to workers: "
    "`aiohttp` or `lean` (its own HTTP/1.1 client, `runtime/upstream/lean.py`; health probes "
    "stay on aiohttp); see [the performance report](../performance/2026-11-27-upstream-client.md)",
    "SWITCHYARD_UPSTREAM_TLS_CA": "CA that signs the workers' certificates (router, supervisors, "
    "measurements); unset: the system's",
    "SWITCHYARD_UPSTREAM_TLS_CERT": "client certificate presented to workers (mTLS)",
    "SWITCHYARD_UPSTREAM_TLS_KEY": "the key of `SWITCHYARD_UPSTREAM_TLS_CERT`",
    "SWITCHYARD_VAR_DIR": "embedded servers' data, generated models, the router's snapshot disk "
    "copy, the usage spool, static files",
}


# Pool policies of prefix-aware routing (per pool, not environment): the sticky rule's keys
# and defaults are read from STICKY (STICKY_POLICY_KEYS, StickyRule's fields); their meanings
# are here.
STICKY = "runtime/routing/sticky.py"
PREFIX_POLICY_MEANINGS: dict[str, str] = {
    "prefix_routing": "`off`: the pool routes by its scorers only (no block hashes computed)",
    "prefix_min_saved_tokens": "the cached tokens (4 characters a token) that make an endpoint "
    "worth preferring; a shorter saving routes by load",
    "prefix_stickiness": "how many tokens of queued prefill one cached token is worth: stick "
    "to the longest cached prefix while `queued(best) - queued(light) <= saved x stickiness "
    "+ slack`",
    "prefix_slack_tokens": "queued prefill tolerated at the cached endpoint beyond that",
    "prefix_max_load": "the chosen endpoint is saturated at `in_flight >= capacity x max_load`: "
    "route by load",
    "prefix_hold_ms": "while the endpoint holding the request's prefix is full, the request waits "
    "up to this long (since it arrived) for a slot there; `0`: never",
    "prefix_hold_min_tokens": "the hold applies only when the full endpoint holds at least this "
    "many more cached tokens of the prompt than any endpoint with room",
}


# Where the default is an expression the table would only restate badly.
DEFAULT_NOTES: dict[str, str] = {
    "SECURE_COOKIES": "`true` with `SWITCHYARD_TLS_CERT`, else `false`",
    "SWITCHYARD_HSTS_SECONDS": "`31536000` with `SWITCHYARD_TLS_CERT` (`switchyard up --tls`: "
    "`3600`), else `0`",
    "SWITCHYARD_STATIC_ROOT": "`$SWITCHYARD_VAR_DIR/staticfiles`",
    "SWITCHYARD_VAR_DIR": "`./var` (the control plane: the repository's; the router: its "
    "working directory's)",
}


@dataclass
class Variable:
    name: str
    defaults: list[str] = field(default_factory=list)
    readers: list[str] = field(default_factory=list)


def _constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level ``NAME = value`` and ``NAME: T = value`` assignments."""
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            out[target.id] = _folded(value, out)
    return out


def _folded(value: ast.expr, known: dict[str, ast.expr]) -> ast.expr:
    """An f-string of constants (``f"{NAMESPACE}:snapshot"``) as the string it makes."""
    if not isinstance(value, ast.JoinedStr):
        return value
    parts: list[str] = []
    for part in value.values:
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            parts.append(part.value)
            continue
        known_value = (
            known.get(part.value.id)
            if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name)
            else None
        )
        if not isinstance(known_value, ast.Constant):
            return value
        parts.append(str(known_value.value))
    return ast.Constant("".join(parts))


class _Reader:
    def __init__(self, own: dict[str, ast.expr], contract: dict[str, ast.expr]) -> None:
        self.own = own
        self.contract = contract

    def resolve(self, node: ast.expr, depth: int = 0) -> ast.expr:
        """Follow a module constant or ``contract.X`` to its value, when it is one."""
        if depth > 5:
            return node
        if isinstance(node, ast.Name) and node.id in self.own:
            value = self.own[node.id]
            if isinstance(value, ast.Constant):
                return value
            return self.resolve(value, depth + 1) if isinstance(value, ast.Attribute) else node
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "contract"
            and node.attr in self.contract
        ):
            value = self.contract[node.attr]
            return value if isinstance(value, ast.Constant) else node
        return node

    def name_of(self, node: ast.expr) -> str | None:
        value = self.resolve(node)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value if ENV_NAME.match(value.value) else None
        return None

    def default_of(self, node: ast.expr | None) -> str:
        value = None if node is None else self.resolve(node)
        if value is None:
            return "unset"
        if isinstance(value, ast.Constant):
            return _constant_text(value.value)
        text = ast.unparse(value)
        text = EXPRESSION_TEXT.get(text, f"`{text}`")
        if isinstance(value, ast.Name) and ENV_NAME.match(value.id):
            return f"`{value.id}`'s value"
        return text


def _constant_text(value: object) -> str:
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


# Defaults written as expressions, as the table shows them.
EXPRESSION_TEXT: dict[str, str] = {"BASE_DIR / 'var'": "`./var`", "1 << 20": "`1048576`"}


def _call_read(
    node: ast.Call, parents: dict[ast.AST, ast.AST]
) -> tuple[ast.expr | None, ast.expr | None]:
    """(name, default) expressions when ``node`` reads the environment, else (None, None)."""
    func, args = node.func, node.args
    if isinstance(func, ast.Name) and func.id == "_env_bool" and args:
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        return args[0], default if default is not None or len(args) < 2 else args[1]
    if isinstance(func, ast.Name) and func.id in {"_number", "_path"} and len(args) >= 2:
        return args[1], args[2] if len(args) > 2 else None  # _path: runtime/tls.py
    if not (isinstance(func, ast.Attribute) and func.attr in {"get", "getenv"} and args):
        return None, None
    owner = func.value
    owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    if func.attr != "getenv" and owner_name not in ENV_MAPPINGS:
        return None, None
    if len(args) > 1:
        return args[0], args[1]
    parent = parents.get(node)
    or_default = (  # env.get(NAME) or default
        parent.values[1]
        if isinstance(parent, ast.BoolOp)
        and isinstance(parent.op, ast.Or)
        and len(parent.values) == 2
        and parent.values[0] is node
        else None
    )
    return args[0], or_default


def _env_reads(tree: ast.Module, reader: _Reader) -> list[tuple[str, str]]:
    """(variable, default) for every read of the environment in one module."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name_arg, default = _call_read(node, parents)
        name = reader.name_of(name_arg) if name_arg is not None else None
        if name is not None:
            found.append((name, reader.default_of(default)))
    return found


def _source_files(root: Path) -> list[tuple[str, str]]:
    return [
        (str(file.relative_to(root)), who)
        for pattern, who in SOURCES
        for file in sorted(root.glob(pattern))
        if str(file.relative_to(root)) not in SKIPPED
    ]


def collect(root: Path = ROOT) -> dict[str, Variable]:
    contract = _constants(ast.parse((root / CONTRACT).read_text()))
    variables: dict[str, Variable] = {}
    for path, who in _source_files(root):
        tree = ast.parse((root / path).read_text(), filename=path)
        reader = _Reader(_constants(tree), contract)
        for name, default in _env_reads(tree, reader):
            var = variables.setdefault(name, Variable(name))
            if default not in var.defaults:
                var.defaults.append(default)
            reader_line = f"{who}: `{path}`"
            if reader_line not in var.readers:
                var.readers.append(reader_line)
    return dict(sorted(variables.items()))


def prefix_policies(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(key, default, meaning) of the pool policies of prefix-aware routing."""
    tree = ast.parse((root / STICKY).read_text(), filename=STICKY)
    keys = ast.literal_eval(_constants(tree)["STICKY_POLICY_KEYS"])
    defaults: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "StickyRule":
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.value is not None
                ):
                    defaults[item.target.id] = ast.unparse(item.value)
    rows = [("prefix_routing", "`on`", PREFIX_POLICY_MEANINGS["prefix_routing"])]
    for key, name in keys.items():
        meaning = PREFIX_POLICY_MEANINGS.get(key, "(undocumented)")
        rows.append((key, f"`{defaults.get(name, '?')}`", meaning))
    return rows


def render(variables: dict[str, Variable]) -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by docs/gen_config_reference.py from the sources below: do not edit by",
        "hand; run `python docs/gen_config_reference.py`. tests/docs checks it is current. -->",
        "",
        "Every process setting is an environment variable, read when a process starts (the "
        "per-pool policies of prefix-aware routing are listed at the end). This table is "
        "generated from the code that reads them:",
        "",
    ]
    lines += [f"- `{path}`: {who}" for path, who in SOURCES]
    lines += [
        "",
        "Ports and the embedded servers are set on the command line or by their own variables: "
        "see [Deploy](../operations/deploy.md#ports). How the settings fit together: "
        "[Configure](../operations/configure.md).",
        "",
        "| variable | default | meaning | read by |",
        "|---|---|---|---|",
    ]
    for var in variables.values():
        default = DEFAULT_NOTES.get(var.name) or " / ".join(var.defaults)
        meaning = MEANINGS.get(var.name, "(undocumented)")
        lines.append(f"| `{var.name}` | {default} | {meaning} | {'; '.join(var.readers)} |")
    lines += [
        "",
        "## Pool policies: prefix-aware routing",
        "",
        "Per pool, not environment: keys of the pool's `policies`, written through the admin or "
        "the REST API and validated there (`runtime/pool_policies.py`); they reach the routers "
        f"in the next snapshot. Keys and defaults are read from `{STICKY}`. The rule they set: "
        "[Prefix-aware routing](../user-guide/prefix-routing.md).",
        "",
        "| pool policy | default | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{key}` | {default} | {meaning} |" for key, default, meaning in prefix_policies()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail when the page is stale")
    args = parser.parse_args(argv)
    text = render(collect())
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            sys.stdout.write(f"{PAGE.relative_to(ROOT)} is stale: run {sys.argv[0]}\n")
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    sys.stdout.write(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
