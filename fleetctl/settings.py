"""All settings, read from the environment in this one module.

Unset, the defaults suit a developer's machine and the tests (SQLite, a local Redis, DEBUG
on). `make demo` turns DEBUG off; .env.example and docker-compose.yml ship it off. With DEBUG
off SECRET_KEY is required: nothing secret has a default that could leak into production.
"""

from __future__ import annotations

import ipaddress
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
import plotly
from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no.")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from exc


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from exc
    if not value >= 0:
        raise ImproperlyConfigured(f"{name}={raw!r} must be 0 or more.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name, "")
    return [item.strip() for item in raw.split(",") if item.strip()] if raw else default


def _networks(name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    try:
        return [ipaddress.ip_network(item, strict=False) for item in env_list(name, [])]
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}; give networks like 10.0.0.0/8,::1/128."
                                   ) from exc


DEBUG = env_bool("DEBUG", True)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "insecure-embedded-demo-key-never-use-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# No page runs script it did not load from this site: stored text that escaped escaping still
# cannot execute. htmx and plotly.js are static files; htmx's eval (hx-on, trigger filters) is
# off (see base.html) so neither needs 'unsafe-eval'. Styles allow 'unsafe-inline': templates
# size bars with style attributes and plotly.js writes <style> rules as it draws (a style
# cannot run script). The Swagger UI loads its init script from its own URL (SplitView).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    },
}
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if not DEBUG else None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "fleetctl.core",
    "fleetctl.accounts",
    "fleetctl.audit",
    "fleetctl.fleet",
    "fleetctl.traffic",
    "fleetctl.xds",
    "migrations_plan",
    "fleetctl.bench",
    "fleetctl.conformance",
    "fleetctl.shadow",
    "fleetctl.evals",
    "fleetctl.webhooks",
    "fleetctl.telemetry",
    "fleetctl.ramps",
    "fleetctl.prometheus",
    "fleetctl.batch",
    "fleetctl.schedules",
    "fleetctl.economics",
    "fleetctl.demo",
    # Sign-in lockout; fleetctl.accounts audits each failure and lockout it sees.
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    # The overview's pool list is re-fetched by htmx; compressed it is a few KiB.
    "django.middleware.gzip.GZipMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "fleetctl.core.middleware.RequestIdMiddleware",
    # /api/v1/drains is /api/v1/drains/ for every method (no redirect dropping a POST body).
    "fleetctl.core.middleware.ApiTrailingSlashMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as axes asks: turns a sign-in refused by the lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "fleetctl.urls"
WSGI_APPLICATION = "fleetctl.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "fleetctl.accounts.dashboard.navigation",
            ],
        },
    },
]

# --- database: PostgreSQL from DATABASE_URL, else a SQLite file the web and worker share ---
DATA_DIR = Path(os.environ.get("FLEETCTL_DATA_DIR", BASE_DIR / "var"))
DATA_DIR.mkdir(parents=True, exist_ok=True)
DATABASE_URL = os.environ.get("DATABASE_URL", "")
# WAL lets the web server read while the worker writes; IMMEDIATE transactions and a busy
# timeout make concurrent writers queue instead of failing with "locked". For any SQLite
# database, the default file or a DATABASE_URL=sqlite:///… one.
SQLITE_OPTIONS = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;"
    ),
}
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS,
                                           **DATABASES["default"].get("OPTIONS", {})}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "fleetctl.sqlite3"),
            "OPTIONS": dict(SQLITE_OPTIONS),
        }
    }
DATABASES["default"]["TEST"] = {}
if os.environ.get("TEST_DATABASE_NAME"):
    # Lets two test runs share one PostgreSQL server without dropping each other's database.
    DATABASES["default"]["TEST"]["NAME"] = os.environ["TEST_DATABASE_NAME"]
if os.environ.get("TEST_DATABASE_TEMPLATE"):
    # PostgreSQL: each test worker's database is a copy of this migrated one (`make test`
    # migrates it once), not migrated again by every worker.
    DATABASES["default"]["TEST"]["TEMPLATE"] = os.environ["TEST_DATABASE_TEMPLATE"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker and the cache ---
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "fleetctl",
    }
}

# --- Celery (the app lives in fleetctl/celery.py; queues and beat are declared there) ---
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None

# --- outbound requests to addresses people give (fleetctl/core/destinations.py) ---
# Webhook receivers, pool endpoints and gateway admin URLs may not reach loopback, this host's
# own addresses, link-local, cloud metadata or other special ranges unless the networks are
# listed here for that purpose (CIDRs, comma-separated). `make demo` and `make test` allow
# loopback for pools and gateways (the simulated fleet and Envoy run on this host) and for
# metric sources (the demo's and tests' own Prometheus); a production deployment usually needs
# none of them.
OUTBOUND_ALLOWED_NETWORKS = {
    purpose: _networks(f"OUTBOUND_ALLOW_{purpose.upper()}")
    for purpose in ("pools", "gateways", "webhooks", "metrics")
}
# Services of this deployment that no user-given address may reach, whatever is allowed above
# (host:port or URLs), beside those fleetctl knows itself: Redis, the database, the shadow
# collector and every registered gateway's admin API. Name the web server's own address here.
OUTBOUND_DENY = env_list("OUTBOUND_DENY", [])

# --- fleet health probing ---
HEALTH_PROBE_INTERVAL_S = env_int("HEALTH_PROBE_INTERVAL_S", 15)
HEALTH_PROBE_TIMEOUT_S = env_int("HEALTH_PROBE_TIMEOUT_S", 5)
HEALTH_FAILURES_TO_UNHEALTHY = env_int("HEALTH_FAILURES_TO_UNHEALTHY", 3)
HEALTH_SUCCESSES_TO_HEALTHY = env_int("HEALTH_SUCCESSES_TO_HEALTHY", 2)
HEALTH_HISTORY_DAYS = env_int("HEALTH_HISTORY_DAYS", 14)

# --- traffic ---
# Request headers a gateway reads: the caller's residency pin and latency class. The model
# header is set by the gateway itself from the request body (clients cannot choose it).
TRAFFIC_RESIDENCY_HEADER = os.environ.get("TRAFFIC_RESIDENCY_HEADER", "x-fleetctl-residency")
TRAFFIC_LATENCY_CLASS_HEADER = os.environ.get(
    "TRAFFIC_LATENCY_CLASS_HEADER", "x-fleetctl-latency-class"
)
# How often beat reads every gateway back and re-pushes one that drifted (e.g. restarted empty).
TRAFFIC_RECONCILE_INTERVAL_S = env_int("TRAFFIC_RECONCILE_INTERVAL_S", 30)
# How often beat drives pushes whose attempt was lost and advances every open drain, from the
# rows alone (a few queries when nothing is open).
TRAFFIC_CONVERGE_INTERVAL_S = env_float("TRAFFIC_CONVERGE_INTERVAL_S", 2.0)
# How long a drain rehearsal (migration plans) waits for its drain to complete.
DRAIN_WATCH_TIMEOUT_S = env_int("DRAIN_WATCH_TIMEOUT_S", 900)
# A person's drain the primary cannot carry, and no pool carrying the route can take the rest,
# moves in steps this far apart, and finishes by its last step whatever the capacity
# (docs/traffic.md, "Capacity-checked drains"). Steps x interval stays far below the timeout.
DRAIN_STEP_INTERVAL_S = env_int("DRAIN_STEP_INTERVAL_S", 30)
DRAIN_STEPS_MAX = env_int("DRAIN_STEPS_MAX", 4)
# A drain's first push attempt is made by the process that stored it; it waits this long for
# the gateways before answering (slower ones finish and record on their own).
TRAFFIC_INLINE_PUSH_BUDGET_S = env_float("TRAFFIC_INLINE_PUSH_BUDGET_S", 2.0)
# A process that pushes to gateways (web, push worker) hands the interpreter lock between its
# threads this often (Python's default is 5 ms): a drain's pushes run in one thread per
# gateway, and each waits for the lock between its admin calls (benchmarks/drain_latency.py).
TRAFFIC_THREAD_SWITCH_INTERVAL_S = env_float("TRAFFIC_THREAD_SWITCH_INTERVAL_S", 0.0005)
if not TRAFFIC_THREAD_SWITCH_INTERVAL_S > 0:
    raise ImproperlyConfigured("TRAFFIC_THREAD_SWITCH_INTERVAL_S must be more than 0 (seconds).")
# How often beat re-evaluates open plans' gates (voids approvals whose evidence moved).
PLAN_REFRESH_INTERVAL_S = env_int("PLAN_REFRESH_INTERVAL_S", 60)

# --- shadow collector (fleetctl/shadow/collector.py) ---
# A mirrored request body larger than this is refused (413) and counted dropped_too_large.
SHADOW_MAX_BODY_BYTES = env_int("SHADOW_MAX_BODY_BYTES", 1024 * 1024)
# The collector (and replay) drop samples, counted dropped_behind, while the Celery `shadow`
# queue holds this many messages: the workers are behind, and a backlog only grows stale.
SHADOW_MAX_QUEUED = env_int("SHADOW_MAX_QUEUED", 500)
# Where gateways send mirrored requests (http://host:port), unless a gateway's option
# `shadow_collector` names another: the collector of this deployment.
SHADOW_COLLECTOR_URL = os.environ.get("SHADOW_COLLECTOR_URL", "http://127.0.0.1:9911")
# --- shadow runs (fleetctl/shadow/services/) ---
# How often beat judges every running shadow run (a judgement row, evidence when it changed).
SHADOW_JUDGE_INTERVAL_S = env_int("SHADOW_JUDGE_INTERVAL_S", 15)
# One side of a shadow pair (a whole answer, streamed or not) gets this long, then it is an
# error answer (status 0): never retried, never failed over.
SHADOW_PAIR_TIMEOUT_S = env_float("SHADOW_PAIR_TIMEOUT_S", 120.0)
# The judge judges a running run on the first pair of each distinct request, in order, at
# most this many: a sample that only grows (its confidence sequence is valid at every look) at
# a bounded cost per look however long the run lasts. The latency figures read the newest
# this many pairs.
SHADOW_JUDGE_WINDOW_PAIRS = env_int("SHADOW_JUDGE_WINDOW_PAIRS", 20_000)
# --- eval runs (fleetctl/evals/) ---
# A running eval run whose heartbeat (beaten every 2 s by the worker driving it) is older than
# this is taken over by another worker (beat `evals.reap`); so is a queued run no worker took.
EVAL_HEARTBEAT_STALE_S = env_int("EVAL_HEARTBEAT_STALE_S", 60)
# A suite holds at most this many items (an upload with more is refused, naming the line).
EVAL_MAX_SUITE_ITEMS = env_int("EVAL_MAX_SUITE_ITEMS", 100_000)
# A suite file (JSONL) larger than this is refused before it is read.
EVAL_MAX_UPLOAD_BYTES = env_int("EVAL_MAX_UPLOAD_BYTES", 64 * 1024 * 1024)
# --- telemetry (fleetctl/telemetry/) and ramps (fleetctl/ramps/) ---
# The ingester's finest window (s), and how often it adds what it read to the rows (s).
TELEMETRY_WINDOW_S = env_int("TELEMETRY_WINDOW_S", 10)
TELEMETRY_FLUSH_INTERVAL_S = env_float("TELEMETRY_FLUSH_INTERVAL_S", 1.0)
# How often the ingester scrapes each pool's /metrics (TPOT), in seconds.
TELEMETRY_SCRAPE_INTERVAL_S = env_float("TELEMETRY_SCRAPE_INTERVAL_S", 10.0)
# One ingester per shard (a gateway's log, the scrape) at a time: a shard's lease (and an
# ingester's heartbeat) lasts 3 flush intervals, at least TELEMETRY_LEASE_MIN_S (a killed
# ingester's shards wait this long for another); after a database error an ingester tries
# again within min(1 s, TELEMETRY_LEASE_WAIT_S). The tests shorten both.
TELEMETRY_LEASE_MIN_S = env_float("TELEMETRY_LEASE_MIN_S", 10.0)
TELEMETRY_LEASE_WAIT_S = env_float("TELEMETRY_LEASE_WAIT_S", 3.0)
# How often beat ticks the ramps (each due ramp is claimed with a lease of RAMP_LEASE_S).
RAMP_TICK_INTERVAL_S = env_float("RAMP_TICK_INTERVAL_S", 2.0)
RAMP_LEASE_S = env_float("RAMP_LEASE_S", 30.0)
# --- batch jobs (fleetctl/batch/) ---
# Validated input files are kept here (relative names in BatchFile.path).
BATCH_FILES_DIR = Path(os.environ.get("BATCH_FILES_DIR") or DATA_DIR / "batch-files")
# A chunk's holder renews its lease every BATCH_LEASE_S / 3 s; a lease this old is lapsed and
# another worker takes the chunk over (its in-flight requests recorded and sent again).
BATCH_LEASE_S = env_float("BATCH_LEASE_S", 30.0)
# Group commit (fleetctl/batch/store.py): a holder writes its results in groups of at most
# BATCH_CHECKPOINT_GROUP, each group committed once it is full or its oldest answer is
# BATCH_CHECKPOINT_MS old, and reserves min(BATCH_CHECKPOINT_GROUP, 2 x the job's concurrency)
# indices per dispatch checkpoint. 1 gives the per-request checkpoint (two commits a request).
BATCH_CHECKPOINT_GROUP = max(1, env_int("BATCH_CHECKPOINT_GROUP", 100))
BATCH_CHECKPOINT_MS = env_float("BATCH_CHECKPOINT_MS", 50.0)
# An input holds at most this many requests, each line at most this many bytes.
BATCH_MAX_REQUESTS = env_int("BATCH_MAX_REQUESTS", 5_000_000)
BATCH_MAX_BODY_BYTES = env_int("BATCH_MAX_BODY_BYTES", 256 * 1024)
BATCH_MAX_UPLOAD_BYTES = env_int("BATCH_MAX_UPLOAD_BYTES", 2 * 1024 * 1024 * 1024)
# How often beat ticks the batch controller (expiry, soak schedules, drill verdicts).
BATCH_TICK_INTERVAL_S = env_float("BATCH_TICK_INTERVAL_S", 5.0)
# Beat fires the schedules people edit (fleetctl/schedules/) this often, in seconds.
SCHEDULES_TICK_S = env_float("SCHEDULES_TICK_S", 10.0)
# Idempotency-Key answers are kept this long.
IDEMPOTENCY_TTL_HOURS = env_int("IDEMPOTENCY_TTL_HOURS", 24)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# --- sign-in lockout (django-axes) and API authentication throttling ---
AUTHENTICATION_BACKENDS = [
    "fleetctl.accounts.backends.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# A username is locked from one address, not everywhere: locking the username alone would let
# anyone lock the on-call out of the dashboard during an incident, and locking the address alone
# would lock out a whole office behind one NAT. Every failure is audited, so guessing spread
# over many addresses is still visible.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15))
# Attempts during a lockout do not extend it, so the retry time the lockout page gives holds.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
# A successful sign-in forgets earlier typos from that address.
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "fleetctl.accounts.views.login_locked_out"
# The client address is REMOTE_ADDR (X-Forwarded-For is not trusted: a client could choose it).
# Bearer tokens: this many invalid ones from one address within the window block every bearer
# request from it (429 with Retry-After) for API_AUTH_BLOCK_S. Counted in the cache (Redis).
API_AUTH_FAILURE_LIMIT = env_int("API_AUTH_FAILURE_LIMIT", 10)
API_AUTH_FAILURE_WINDOW_S = env_int("API_AUTH_FAILURE_WINDOW_S", 300)
API_AUTH_BLOCK_S = env_int("API_AUTH_BLOCK_S", 300)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet:overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every start without it
# plotly.js is served from the installed plotly package (static/plotly/plotly.min.js), so the
# repository never carries a second, drifting copy of it.
STATICFILES_DIRS = [BASE_DIR / "static", ("plotly", Path(plotly.__file__).parent / "package_data")]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleetctl.accounts.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["fleetctl.accounts.permissions.IsAuthenticatedActor"],
    # django-filter's and DRF's, strict: a query value a list cannot read is a 400 naming it.
    "DEFAULT_FILTER_BACKENDS": [
        "fleetctl.core.api.filters.FilterBackend",
        "fleetctl.core.api.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "fleetctl.core.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "fleetctl.core.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "fleetctl API",
    "DESCRIPTION": (
        "Control plane for staged LLM-serving migrations. Authenticate with "
        "`Authorization: Bearer <token>`; create a token on the Tokens page or at "
        "/api/v1/tokens/. Errors are always `{\"error\": {\"code\", \"message\", \"fields\"}}`."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Views are built with a request of nobody's identity while the schema is generated: no
    # permission is checked as the caller, nothing audited (accounts/api/viewsets.py).
    "GET_MOCK_REQUEST": "fleetctl.accounts.api.viewsets.describing_request",
    # Every operation documents the errors it can answer, in the one error shape.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "fleetctl.core.api.schema.add_error_responses"],
    # Stable names for choice sets that share a field name, so a generated client's enums
    # do not get hash-suffixed names that change with the choices.
    "ENUM_NAME_OVERRIDES": {
        "PushStatusEnum": "fleetctl.traffic.models.GatewayPush.Status",
        "BenchRunStatusEnum": "fleetctl.bench.models.Run.Status",
        "BenchRunModeEnum": "fleetctl.bench.models.Run.Mode",
        # Conformance and eval runs speak the job words alone (fleetctl/core/jobs.py); bench
        # adds `partial`, shadow `stopped`.
        "JobStatusEnum": "fleetctl.core.jobs.JobStatus",
        "ConformanceVerdictEnum": "fleetctl.conformance.models.ConformanceRun.Verdict",
        "ShadowRunStatusEnum": "fleetctl.shadow.models.ShadowRun.Status",
        "ShadowModeEnum": "fleetctl.shadow.models.ShadowRun.Mode",
        "ShadowContentEnum": "fleetctl.shadow.models.ShadowRun.Content",
        "TokenKindEnum": "fleetctl.accounts.models.ApiToken.Kind",
        "GateStatusEnum": "migrations_plan.evidence.STATUSES",
        "HealthStateEnum": "fleetctl.fleet.models.Pool.Health",
        "JurisdictionEnum": "fleetctl.fleet.models.JURISDICTIONS.items",
        "CurrencyEnum": "fleetctl.fleet.models.CURRENCIES",
        "PlanStateEnum": "migrations_plan.models.Plan.State",
        # Shadow and eval runs judge with the kernel's verdict words (one choice set, one name).
        "JobVerdictEnum": "fleetctl.core.jobs.JobVerdict",
        "EvalResultStatusEnum": "fleetctl.evals.models.EvalResult.Status",
        "EvalSuiteSourceEnum": "fleetctl.evals.models.EvalSuite.Source",
        "EvalPoolRoleEnum": "fleetctl.evals.models.EvalRunPool.Role",
        # Shared by a read and the answer to a write (Drain/DrainAnswer, …): named here.
        "DrainStatusEnum": "fleetctl.traffic.models.Drain.Status",
        "RevisionKindEnum": "fleetctl.traffic.models.SplitRevision.Kind",
        "RampStateEnum": "fleetctl.ramps.models.Ramp.State",
        "WatchStateEnum": "fleetctl.ramps.models.Watch.State",
        "WatchRoleEnum": "fleetctl.ramps.models.Watch.Role",
        "BatchJobStateEnum": "fleetctl.batch.models.BatchJob.State",
        "SoakStateEnum": "fleetctl.batch.models.Soak.State",
        "BatchDrillEnum": "fleetctl.batch.models.BatchJob.Drill",
        "ScheduleKindEnum": "fleetctl.schedules.models.Schedule.Kind",
        "ScheduleRunOutcomeEnum": "fleetctl.schedules.models.ScheduleRun.Outcome",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # axes logs every sign-in at INFO; its WARNINGs (each failure, each lockout) are kept.
    # httpx logs every request at INFO: an eval run sends thousands.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "axes": {"level": "WARNING"},
                "httpx": {"level": "WARNING"},
                # WeasyPrint logs every layout step of every PDF at INFO; fontTools its
                # font subsetting.
                "weasyprint": {"level": "WARNING"}, "fontTools": {"level": "WARNING"}},
}
