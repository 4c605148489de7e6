"""Settings for every deployment; production differs only by environment variables.

With no DATABASE_URL / REDIS_URL the *embedded default* runs (DESIGN.md, "Configuration"):
SQLite under ``RSI_DATA_DIR``, a Celery broker over SQLite (kombu's SQLAlchemy transport), and
our SQLite channel layer, so worker processes, the web process and browsers still talk across
processes without any server to install.
"""

from __future__ import annotations

import secrets
import warnings
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from rsiweb import env

# Django's generic classes subscriptable at runtime (ModelAdmin[Event], QuerySet[Run]), as the
# type checker wants them written (django-stubs); nothing else changes.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent.parent

DATA_DIR = Path(env.text("RSI_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATABASE_URL = env.text("DATABASE_URL")
REDIS_URL = env.text("REDIS_URL")
EMBEDDED = not DATABASE_URL
DEBUG = env.boolean("DEBUG", default=False)

if EMBEDDED or REDIS_URL == "":
    DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    key = env.get("SECRET_KEY")
    if key:
        return key
    if EMBEDDED or DEBUG:
        # A per-install key, generated once into the data folder, so the demo needs no setup
        # yet two installs never share a key.
        key_file = DATA_DIR / "secret_key"
        if not key_file.exists():
            DATA_DIR.mkdir(parents=True, exist_ok=True)
            key_file.write_text(secrets.token_urlsafe(50))
            key_file.chmod(0o600)
        return key_file.read_text().strip()
    raise ImproperlyConfigured(
        "SECRET_KEY is not set. Production settings (DATABASE_URL set, DEBUG off) refuse to start "
        "without it: export SECRET_KEY=<50+ random characters> or SECRET_KEY_FILE=<path>."
    )


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.listing("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.listing("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    # Redoc's and Swagger UI's bundles, served by us: the API docs load nothing from a CDN.
    "drf_spectacular_sidecar",
    "channels",
    "apps.core",
    "apps.research",
    "apps.benchmarks",
    "apps.datapool",
    "apps.jobs",
    "apps.dojo",
    "apps.experiments",
    "apps.integrity",
    "apps.reviews",
    # The process layer (no models): its ready() registers the flows that follow a job's outcome.
    "apps.flows",
    "apps.expos",
    "apps.live",
    "apps.dashboard",
    # Notifications read off the event log (its append hook is registered in ready()).
    "apps.alerts",
]

MIDDLEWARE = [
    # First: a chunked body is read (or the request refused) before anything looks at the body.
    "apps.core.middleware.ChunkedBodyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files from the web process itself (the dashboard's JS and CSS), no proxy needed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, so its process_exception runs first: a database or Redis outage answers 503, not 500.
    "apps.core.transient.TransientFaultMiddleware",
]

ROOT_URLCONF = "rsiweb.urls"
ASGI_APPLICATION = "rsiweb.asgi.application"
WSGI_APPLICATION = None

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
                "apps.dashboard.context_processors.minibench_build",
            ],
        },
    },
]

DATABASES: dict[str, Any]
if EMBEDDED:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "rsiweb.sqlite3"),
            "OPTIONS": {
                # IMMEDIATE takes the write lock at BEGIN, so two processes appending to the
                # event chain queue up instead of failing with "database is locked" on upgrade.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
else:
    # No persistent connections: a kept connection belongs to one thread, and under an ASGI
    # server sync code runs on whatever thread is free, so one process piled up idle connections
    # until PostgreSQL refused new clients (8 concurrent agents reached 70+ under daphne; Django's
    # docs say to disable them under ASGI). bench/api_vs_mlflow.py, docs/benchmarks.md (issue 4).
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    # The web process borrows connections from a pool instead (psycopg_pool, Django >= 5.1):
    # opening a PostgreSQL connection costs ~3 ms, more than a whole API call. rsiweb/asgi.py
    # turns it on for the process that serves HTTP; Celery workers fork and keep plain
    # connections (a pool opened before a fork would share its sockets with the children).
    if (pool_size := env.integer("RSI_DB_POOL", 0)) > 0:
        DATABASES["default"]["OPTIONS"] = {
            **DATABASES["default"].get("OPTIONS", {}),
            # The pool has a connection per HTTP thread and two more, so a request waits for one
            # only while the database is away: then a 503 in seconds beats a request hung for 30.
            "pool": {"min_size": 1, "max_size": pool_size, "timeout": env.number("RSI_DB_POOL_TIMEOUT", 5.0)},
        }
        # The pool tests each connection (psycopg_pool's ConnectionPool.check_connection, an empty
        # query) before lending it; Django passes that check only with CONN_HEALTH_CHECKS. Without
        # it, after a PostgreSQL restart the pool lent out connections to the old server (500s for
        # 25 s after the database was back, issue 14).
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# Without `collectstatic` (the demo, a checkout) WhiteNoise finds the files where they live, and
# the missing STATIC_ROOT is expected, not worth a warning at every start.
WHITENOISE_USE_FINDERS = True
warnings.filterwarnings("ignore", message=r"No directory at: .*staticfiles")
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

# --- artifacts and sealed data -------------------------------------------------------------
# Agents' data and checkpoints live in the artifact store (a folder or an fsspec URL); sealed
# benchmark data lives elsewhere, readable only by evaluation workers (DESIGN.md).
ARTIFACT_ROOT = env.text("RSI_ARTIFACT_ROOT", str(DATA_DIR / "artifacts"))
SEALED_ROOT = env.text("RSI_SEALED_ROOT", str(DATA_DIR / "sealed"))
WORKSPACE_ROOT = env.text("RSI_WORKSPACE_ROOT", str(DATA_DIR / "workspaces"))
MINIBENCH_ROOT = env.text("RSI_MINIBENCH_ROOT", str(DATA_DIR / "minibench"))
# The instance's Ed25519 key: signs run chain heads and run bundles (apps.experiments.anchors).
INSTANCE_KEY_FILE = env.text("RSI_INSTANCE_KEY_FILE", str(DATA_DIR / "instance-ed25519.pem"))
# Public keys (hex) or their fingerprints whose run bundles import_run accepts, beside this instance's own.
RSI_TRUSTED_INSTANCE_KEYS = env.listing("RSI_TRUSTED_INSTANCE_KEYS")
# The most bytes a run bundle's run.json may inflate to (import_run refuses a larger one unread).
RSI_BUNDLE_MAX_BYTES = env.integer("RSI_BUNDLE_MAX_BYTES", 256 * 1024 * 1024)
# Teacher detection (apps.integrity.teacher, docs/run-policy.md): how many prompts of each SFT
# dataset are run through each candidate teacher, and how many candidates are compared.
RSI_TEACHER_SAMPLE_ROWS = env.integer("RSI_TEACHER_SAMPLE_ROWS", 64)
RSI_TEACHER_MAX_CANDIDATES = env.integer("RSI_TEACHER_MAX_CANDIDATES", 8)

# --- Celery ----------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL or f"sqla+sqlite:///{DATA_DIR / 'broker.sqlite3'}"
# Results live in our Job rows; the broker only carries "look at row N" (STYLE.md).
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker keeps reconnecting for as long as the broker is away: Celery's default gives up after
# 100 tries and the worker exits (tests/faults/test_broker.py).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A send while the broker restarts is retried for about 15 s (Celery's default: 3 tries within
# 0.6 s), so a short outage loses no message; what a longer one loses, the reaper re-sends
# (job messages, agent steps and supervisor ticks: workers.runtime).
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 10, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}
if REDIS_URL:
    # With acks_late a message is redelivered after the visibility timeout: it must exceed the
    # longest job, or a second GPU starts the same job (our claim would then refuse it anyway).
    # (The SQLite broker has no such option: SQLAlchemy would reject it.)
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.integer("RSI_VISIBILITY_TIMEOUT", 43200)}
CELERY_TASK_TIME_LIMIT = env.integer("RSI_JOB_TIME_LIMIT", 6 * 3600)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 60

# --- Channels --------------------------------------------------------------------------------
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis, with a receive that always ends when cancelled and takes queued
            # messages in batches (apps/live/layers.py says why).
            "BACKEND": "apps.live.layers.RedisChannelLayer",
            # channels_redis waits for messages with a 5 s BZPOPMIN; redis-py 8's default read
            # timeout is also 5 s, so an idle consumer's read times out as Redis answers and the
            # websocket dies (tests/apps/dashboard/test_consumers.py, idle socket). Read timeout
            # well above the wait; capacity for a run page's bursts (default 100 per socket).
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
                "capacity": 1000,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "apps.live.layers.SQLiteChannelLayer",
            "CONFIG": {"path": str(DATA_DIR / "channels.sqlite3")},
        }
    }

# --- REST ------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Agents: bearer tokens bound to (run, node, role); people: the Django session.
        "apps.expos.auth.AgentTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["apps.expos.auth.AgentTokenRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "apps.core.api.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "rsiweb ExpOS API",
    "DESCRIPTION": "The Experiment OS: every data, training and evaluation action as a tool.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # 3.1: tool schemas are JSON Schema 2020-12 and go into the document unchanged.
    "OAS_VERSION": "3.1.0",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.expos.openapi.postprocess",  # one path per registered tool
    ],
    # Offline-first: the viewers come from drf-spectacular-sidecar's static files (pinned in
    # pyproject.toml), and templates/drf_spectacular/redoc.html drops the Google Fonts links.
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_UI_SETTINGS": {
        "theme": {
            "typography": {
                "fontFamily": "system-ui, -apple-system, Segoe UI, sans-serif",
                "headings": {"fontFamily": "system-ui, -apple-system, Segoe UI, sans-serif"},
                "code": {"fontFamily": "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"},
            }
        }
    },
}
# Per agent token, e.g. "600/min"; empty turns the limit off.
RSI_TOKEN_RATE = env.text("RSI_TOKEN_RATE", "600/min")
# How long permits a web process leases from that shared limit stay usable (apps.expos.auth): a
# token can run at most one lease (<= this many seconds of its rate, <= 64 calls) ahead of its
# rate. 0: no leases, one Redis round trip per call.
RSI_TOKEN_RATE_LEASE_SECONDS = env.number("RSI_TOKEN_RATE_LEASE_SECONDS", 1.0)
# How long a web process reuses a resolved agent token (apps.expos.auth): the most a revocation,
# or the end of the token's run, lags in the other processes. 0: look it up on every call.
RSI_TOKEN_CACHE_SECONDS = env.integer("RSI_TOKEN_CACHE_SECONDS", 5)
# An event inserted unsealed (its chain was being sealed by another transaction) is sealed after
# its writer's commit: by a background thread of the process when on (the web server turns it on,
# rsiweb/asgi.py), else by the writer itself before its call returns (apps.experiments.events).
RSI_EVENT_SEAL_BACKGROUND = env.boolean("RSI_EVENT_SEAL_BACKGROUND", False)
# Throttle counts (and any other cache use) are shared by all web processes through Redis.
# Short socket timeouts: an unreachable Redis must fail a request's throttle check in seconds
# (and the limiter then degrades open), not hang it.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "apps.core.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
        }
    }
# While Redis is unreachable the per-token limit lets calls through uncounted for at most this
# long (an event on the run records it), then answers 503 until Redis is back.
RSI_RATE_LIMIT_FAIL_OPEN_SECONDS = env.number("RSI_RATE_LIMIT_FAIL_OPEN_SECONDS", 60.0)
# What a 503 for a transient fault (database, Redis, broker briefly away) asks callers to wait.
RSI_RETRY_AFTER_SECONDS = env.integer("RSI_RETRY_AFTER_SECONDS", 5)
DATA_UPLOAD_MAX_MEMORY_SIZE = env.integer("RSI_MAX_REQUEST_BYTES", 2 * 1024 * 1024)

# --- agents ------------------------------------------------------------------------------------
# Where the agent loops (Celery, queue `agents`) reach the REST API of the web process.
RSI_API_URL = env.text("RSI_API_URL", "http://127.0.0.1:8000")
RSI_LLM_BASE_URL = env.text("RSI_LLM_BASE_URL")

# Alerts (apps.alerts): links in messages point here; e-mail goes through Django's mail settings
# (EMAIL_BACKEND smtp by default with EMAIL_HOST / EMAIL_PORT / EMAIL_HOST_USER / ..._PASSWORD).
SITE_URL = env.text("RSI_SITE_URL", "http://127.0.0.1:8000")
EMAIL_BACKEND = env.text("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env.text("EMAIL_HOST", "localhost")
EMAIL_PORT = env.integer("EMAIL_PORT", 25)
EMAIL_HOST_USER = env.text("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env.text("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env.boolean("EMAIL_USE_TLS")
DEFAULT_FROM_EMAIL = env.text("DEFAULT_FROM_EMAIL", "rsiweb@localhost")
RSI_LLM_MODEL = env.text("RSI_LLM_MODEL")
RSI_LLM_API_KEY = env.text("RSI_LLM_API_KEY")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.text("RSI_LOG_LEVEL", "INFO")},
    # One INFO line per request ("HTTP Request: GET .../healthz") drowns what the demo and the
    # workers say; httpx's warnings and errors still show.
    "loggers": {"httpx": {"level": "WARNING"}},
}
