"""Settings for the FC² platform, read from the environment.

Defaults are the embedded ones `make run` uses: SQLite in var/, a filesystem broker (no server), the local provider.
Set DATABASE_URL and REDIS_URL for PostgreSQL and Redis. DEBUG is off unless set, or unless `make run` marked the data
directory as a development checkout's (DEVELOPMENT_MARK); with it off, SECRET_KEY must be given and the production
security settings apply. Tests run under fc2.settings_test.
"""

import ipaddress
import os
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


BOOLEAN_WORDS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def envbool(name: str, default: str) -> bool:
    """NAME as a boolean, any case; unset or blank is `default`. Any other word stops the start: a typo such as
    DEBUG=ture must not quietly mean false."""
    value = os.environ.get(name, "").strip() or default
    try:
        return BOOLEAN_WORDS[value.lower()]
    except KeyError:
        accepted = "/".join(BOOLEAN_WORDS)
        raise ImproperlyConfigured(f"{name} must be one of {accepted} (any case), got {value!r}") from None


def envint(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from exc


def envsecret(name: str, default: str | None = None) -> str | None:
    """A secret from NAME, or from the file named by NAME_FILE (which must exist)."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


# Runtime state (database file, uploads, artifacts, broker queue, local clusters) lives under one directory.
VAR_DIR = Path(os.environ.get("FC2_VAR_DIR", BASE_DIR / "var")).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Off unless asked for: a forgotten variable must not serve tracebacks under a published key. A checkout that `make run`
# (or `make setup` with DEBUG=1) set up for development says so in its data directory, so that the README's
# `manage.py` commands run in a fresh shell with the same defaults as `make run`; an explicit DEBUG always wins, and an
# image or a server set up for production has no such file.
DEVELOPMENT_MARK = VAR_DIR / "development"
DEBUG = envbool("DEBUG", "true" if DEVELOPMENT_MARK.exists() else "false")
secret_key = envsecret("SECRET_KEY", "dev-only-insecure-key" if DEBUG else None)
if secret_key is None:
    raise ImproperlyConfigured(
        "SECRET_KEY (or SECRET_KEY_FILE) must be set when DEBUG is off; for development, run `make run` once "
        "in this checkout, or set DEBUG=1"
    )
SECRET_KEY = secret_key  # a str from here on, as every reader of the setting may take it
if not SECRET_KEY.strip():
    # A blank key would still sign sessions and reset links, with a value anyone can guess.
    raise ImproperlyConfigured("SECRET_KEY (or the file SECRET_KEY_FILE names) is empty or only whitespace")
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

MEDIA_ROOT = Path(os.environ.get("FC2_MEDIA_ROOT", VAR_DIR / "media")).resolve()  # uploads and artifacts
MEDIA_URL = "/media/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]

# Where cluster nodes send their reports: the platform's address as the nodes see it.
FC2_PUBLIC_URL = os.environ.get("FC2_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
FC2_LOCAL_CLUSTER_DIR = Path(os.environ.get("FC2_LOCAL_CLUSTER_DIR", VAR_DIR / "clusters")).resolve()
FC2_MAX_BUNDLE_MB = envint("FC2_MAX_BUNDLE_MB", 50)
FC2_MAX_DATASET_MB = envint("FC2_MAX_DATASET_MB", 500)
FC2_MAX_ARTIFACT_MB = envint("FC2_MAX_ARTIFACT_MB", 200)
# Job submissions through the API (POST /api/jobs, re-runs) each user may make, whatever tokens they have: N jobs in
# the last second|minute|hour|day (fc2.services.submissions).
FC2_API_SUBMIT_RATE = os.environ.get("FC2_API_SUBMIT_RATE", "30/hour").strip()
if not re.fullmatch(r"\d+/(s|sec|second|m|min|minute|h|hour|d|day)", FC2_API_SUBMIT_RATE):
    raise ImproperlyConfigured(f"FC2_API_SUBMIT_RATE must be N/second|minute|hour|day, not {FC2_API_SUBMIT_RATE!r}")
# The most live (neither revoked nor expired) personal API tokens one user may have.
FC2_MAX_API_TOKENS_PER_USER = envint("FC2_MAX_API_TOKENS_PER_USER", 20)
# URL datasets come from public addresses only (monitor/safe_fetch.py); an operator may allow private networks on
# purpose, e.g. a lab's data mirror: comma-separated CIDRs. Checked at submit time and again by the downloading node.
_networks = os.environ.get("FC2_DATASET_ALLOWED_NETWORKS", "")
FC2_DATASET_ALLOWED_NETWORKS = [network.strip() for network in _networks.split(",") if network.strip()]
for _network in FC2_DATASET_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError as exc:
        raise ImproperlyConfigured(f"FC2_DATASET_ALLOWED_NETWORKS: {_network!r} is not a CIDR network: {exc}") from exc
# How long a process may give a recommendation again from what it read before (recommender/service.py): a write by
# another process, a bulk update or raw SQL is seen within this many seconds; 0: never memoised.
FC2_RECOMMEND_MEMO_S = float(os.environ.get("FC2_RECOMMEND_MEMO_S", "5"))
# A job that has not finished after this long is failed and its cluster torn down.
FC2_JOB_TIMEOUT_S = envint("FC2_JOB_TIMEOUT_S", 6 * 3600)
# Local jobs run sandboxed (provisioner/sandbox.py), which needs root; without it they are refused unless the operator
# of a single-user machine allows them to run as the platform's own user.
FC2_UNSANDBOXED_LOCAL_JOBS = envbool("FC2_UNSANDBOXED_LOCAL_JOBS", "false")
# Limits of a sandboxed local cluster: the disk each node may write (its work and output directories together; past it
# ENOSPC) and the memory of all the cluster's nodes together (past it the kernel kills one: the job fails, "out of
# memory"), by default three quarters of the machine's.
# The lab provider (provisioner/lab/): its clusters' state, and the private network its clusters' subnets (a /24
# each, on bridges of their own) are taken from — any part of it in use on this machine is skipped.
FC2_LAB_DIR = Path(os.environ.get("FC2_LAB_DIR", VAR_DIR / "lab")).resolve()
FC2_LAB_NETWORK = os.environ.get("FC2_LAB_NETWORK", "10.213.0.0/16")
# Lab nodes reach the platform at their bridge's address (the first of their cluster's /24), which is the Host their
# reports carry: every such address is one of the platform's names.
ALLOWED_HOSTS += [str(net.network_address + 1) for net in ipaddress.ip_network(FC2_LAB_NETWORK).subnets(new_prefix=24)]
# The aws provider (provisioner/aws/). Credentials are boto3's own chain (AWS_ACCESS_KEY_ID…, AWS_PROFILE, an
# instance profile) and AWS_ENDPOINT_URL is honoured by boto3 itself (moto or LocalStack can stand in for EC2).
# FC2_AWS_REGION: where clusters are made unless a job says otherwise (the fc2-2018 catalogue is Singapore's);
# FC2_AWS_REGIONS: every region the reaper looks for leftovers in. FC2_AWS_DIR keeps each cluster's SSH key (encrypted
# with a passphrase derived from FC2_AWS_KEY_PASSPHRASE, by default from SECRET_KEY) and known_hosts.
FC2_AWS_DIR = Path(os.environ.get("FC2_AWS_DIR", VAR_DIR / "aws")).resolve()
FC2_AWS_REGION = os.environ.get("FC2_AWS_REGION", "ap-southeast-1")
FC2_AWS_REGIONS = [r.strip() for r in os.environ.get("FC2_AWS_REGIONS", FC2_AWS_REGION).split(",") if r.strip()]
FC2_AWS_KEY_PASSPHRASE = envsecret("FC2_AWS_KEY_PASSPHRASE", "") or ""
FC2_AWS_INSTALLATION = os.environ.get("FC2_AWS_INSTALLATION", "")  # default: derived from FC2_VAR_DIR
# The machine image: FC2_AWS_AMI, else the SSM public parameter naming the latest one (needs Python 3 with venv and
# pip), logged in to as FC2_AWS_SSH_USER; the nodes' directories under FC2_AWS_NODE_DIR, the job's env made with
# FC2_AWS_PYTHON.
FC2_AWS_AMI = os.environ.get("FC2_AWS_AMI", "")
FC2_AWS_AMI_PARAMETER = os.environ.get(
    "FC2_AWS_AMI_PARAMETER", "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-6.1-x86_64"
)
FC2_AWS_SSH_USER = os.environ.get("FC2_AWS_SSH_USER", "ec2-user")
FC2_AWS_NODE_DIR = os.environ.get("FC2_AWS_NODE_DIR", "/home/{user}/fc2")
FC2_AWS_PYTHON = os.environ.get("FC2_AWS_PYTHON", "python3")
# A PyTorch job's nodes without a GPU get torch's CPU build from this index, before the bundle, at the version the
# bundle asks (PyPI's Linux torch is the CUDA build: GBs with its nvidia-* dependencies); an operator may name a
# mirror. A machine whose image has torch already (local and lab nodes: the platform's own) takes nothing from it.
FC2_TORCH_INDEX_URL = os.environ.get("FC2_TORCH_INDEX_URL", "https://download.pytorch.org/whl/cpu")
# The network: a VPC per cluster from FC2_AWS_VPC_CIDR, or the operator's subnet FC2_AWS_SUBNET_ID; SSH admitted
# from FC2_AWS_SSH_CIDR and made to the nodes' public addresses (FC2_AWS_SSH_ADDRESS=private: a platform in the VPC).
FC2_AWS_SUBNET_ID = os.environ.get("FC2_AWS_SUBNET_ID", "")
FC2_AWS_VPC_CIDR = os.environ.get("FC2_AWS_VPC_CIDR", "10.0.0.0/16")
FC2_AWS_SSH_CIDR = os.environ.get("FC2_AWS_SSH_CIDR", "0.0.0.0/0")
FC2_AWS_SSH_ADDRESS = os.environ.get("FC2_AWS_SSH_ADDRESS", "public")
if FC2_AWS_SSH_ADDRESS not in ("public", "private"):
    raise ImproperlyConfigured(f"FC2_AWS_SSH_ADDRESS must be 'public' or 'private', not {FC2_AWS_SSH_ADDRESS!r}")
FC2_AWS_PLACEMENT_GROUPS = envbool("FC2_AWS_PLACEMENT_GROUPS", "true")
FC2_LOCAL_NODE_DISK_MB = envint("FC2_LOCAL_NODE_DISK_MB", 4096)


def _machine_tasks() -> int:
    """Task ids (processes and threads) this machine has: the lower of its pid and thread limits."""
    try:
        return min(int(Path(f"/proc/sys/kernel/{name}").read_text()) for name in ("pid_max", "threads-max"))
    except (OSError, ValueError):  # not Linux: no sandbox, no local cluster is admitted by this
        return 32768


_machine_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 if hasattr(os, "sysconf") else 4096
FC2_LOCAL_CLUSTER_MEMORY_MB = envint("FC2_LOCAL_CLUSTER_MEMORY_MB", _machine_mb * 3 // 4)
# What all sandboxed clusters on this machine may have together (provisioner/sandbox.py): memory (their cgroups'
# parent is limited to it) and task ids (each local cluster is admitted with its 4,096 only while they fit; a launch
# waits for its turn meanwhile). A quarter of each is the platform's and the machine's, whatever the jobs do.
FC2_LOCAL_CLUSTERS_MEMORY_MB = envint("FC2_LOCAL_CLUSTERS_MEMORY_MB", _machine_mb * 3 // 4)
FC2_LOCAL_CLUSTERS_MAX_TASKS = envint("FC2_LOCAL_CLUSTERS_MAX_TASKS", _machine_tasks() * 3 // 4)
# Lost workers (fc2/services/sweep.py): whoever runs a job's step holds a lease on the job, renewed every third of
# FC2_LEASE_S, so a lease left to expire means its worker is gone. A step sent to the workers and not started within
# FC2_STEP_PICKUP_S was lost with its message (generous: a busy queue must not look like a lost message). Nodes report
# every ~2 s; one silent for FC2_NODE_SILENCE_S has its kept result looked for, and one silent for FC2_NODE_LOST_S,
# alive or not, fails its job naming it (a node that cannot reach the platform, or a machine nobody can reach, must
# not hold a cluster until the time limit; its agent keeps an hour of samples, so a platform down for minutes loses
# nothing). The sweep runs every
# FC2_SWEEP_INTERVAL_S (Celery beat), enforces FC2_JOB_TIMEOUT_S in every state, and sends a lost step again at most
# FC2_STEP_RESENDS times.
FC2_LEASE_S = envint("FC2_LEASE_S", 30)
FC2_STEP_PICKUP_S = envint("FC2_STEP_PICKUP_S", 120)
FC2_NODE_SILENCE_S = envint("FC2_NODE_SILENCE_S", 20)
FC2_NODE_LOST_S = envint("FC2_NODE_LOST_S", 600)
# A node that neither reports nor answers on its machine (its host gone, its link cut, its SSH server dead) for this
# long is lost: its job fails naming it, without waiting for FC2_NODE_LOST_S (meant for a node that runs but cannot
# reach the platform, whose results are still on it).
FC2_NODE_UNREACHABLE_S = envint("FC2_NODE_UNREACHABLE_S", 40)
# Scala-Opt's profiling run (fc2/services/profiling.py): it ends once its worker has communicated for
# FC2_PROFILE_BUSY_S, and at the latest FC2_PROFILE_S (and FC2_RUN_START_S for its start) after its nodes started.
FC2_PROFILE_S = envint("FC2_PROFILE_S", 120)
FC2_PROFILE_BUSY_S = envint("FC2_PROFILE_BUSY_S", 20)
# How long a short run's code (a profiling run's, a trial's) may take to start — imports, data, tracing — before its
# window counts: the run waits that much past its window before it gives up on the code.
FC2_RUN_START_S = envint("FC2_RUN_START_S", 60)
# explore's trial runs (fc2/services/trials.py): each trains for FC2_EXPLORE_TRIAL_S (FC2_TRAIN_SECONDS on its
# nodes) and is torn down; a search's default budget, which the user may change per job, is FC2_EXPLORE_USD dollars and
# FC2_EXPLORE_MINUTES minutes.
FC2_EXPLORE_TRIAL_S = envint("FC2_EXPLORE_TRIAL_S", 120)
FC2_EXPLORE_USD = envint("FC2_EXPLORE_USD", 5)
FC2_EXPLORE_MINUTES = envint("FC2_EXPLORE_MINUTES", 30)
# How many trial runs of one search may overlap in time, where its budget allows (1: one after another).
FC2_EXPLORE_AT_ONCE = envint("FC2_EXPLORE_AT_ONCE", 3)
# The rule the recommender's own doors (its API, `manage.py recommend --provider`) count a trial's minutes on a
# provider by, its start-up and teardown included, None for a provider there is not: the platform's, by dotted path,
# since the recommender knows no provider (recommender.service.trial_minutes); "": a trial is its window alone.
FC2_TRIAL_MINUTES_RULE = "fc2.services.planning.known_trial_minutes"

# Managed jobs (issue 45): a node's agent stops its own machine once the platform has been silent to it for
# FC2_NODE_ORPHAN_S; the chief's checkpoints are kept on the platform, the latest FC2_CHECKPOINTS_KEPT, each at most
# FC2_CHECKPOINT_MAX_MB.
FC2_NODE_ORPHAN_S = envint("FC2_NODE_ORPHAN_S", 1800)
FC2_CHECKPOINTS_KEPT = envint("FC2_CHECKPOINTS_KEPT", 2)
FC2_CHECKPOINT_MAX_MB = envint("FC2_CHECKPOINT_MAX_MB", 200)
# Where an aws spot node's agent polls for an interruption notice (spot/instance-action; "": never). The tests' is "".
FC2_AWS_METADATA_URL = os.environ.get("FC2_AWS_METADATA_URL", "http://169.254.169.254/latest")
FC2_SWEEP_INTERVAL_S = envint("FC2_SWEEP_INTERVAL_S", 5)
# Each Celery worker beats every third of FC2_WORKER_SILENCE_S while it consumes (fc2/celery.py); when none has
# beaten for that long, pages, the API and the CLI say that no worker is taking jobs (fc2/services/workers.py).
FC2_WORKER_SILENCE_S = envint("FC2_WORKER_SILENCE_S", 30)
FC2_SAMPLE_FULL_DAYS = envint("FC2_SAMPLE_FULL_DAYS", 7)  # node samples kept whole this long after a job ends
FC2_STEP_RESENDS = envint("FC2_STEP_RESENDS", 2)
# Sweeps in a row that may fail on one job (an error looking after it, e.g. a result it cannot apply) before the job
# ends with the error and its cluster is torn down: a job the platform cannot look after must not run on for good.
FC2_SWEEP_ATTEMPTS = envint("FC2_SWEEP_ATTEMPTS", 3)
# Attempts of a resumable step that fails transiently (a node's SSH not up yet, a cloud API throttling), with backoff.
FC2_STEP_ATTEMPTS = envint("FC2_STEP_ATTEMPTS", 4)
# After a mirrored job's chief succeeds, its other workers end on their own (the final barrier): teardown waits up to
# this long for them, so that their outputs and logs are kept rather than cut off.
FC2_WORKERS_FINISH_S = envint("FC2_WORKERS_FINISH_S", 15)
# Tests only: "state=seconds,…" holds the step of that state (e.g. provisioning: launched, not yet recorded) that long,
# so that a test can kill the worker running it there (tests/test_faults.py).
FC2_FAULT_PAUSE = {
    state.strip(): float(seconds)
    for state, _, seconds in (item.partition("=") for item in os.environ.get("FC2_FAULT_PAUSE", "").split(","))
    if state.strip()
}

FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
# A node's final report carries each output as a file, up to monitor.agent.MAX_OUTPUT_FILES (Django's default, 100,
# would refuse a job's 101st); what the files weigh is bounded per endpoint (fc2/uploads.py).
DATA_UPLOAD_MAX_NUMBER_FILES = 10_000

INSTALLED_APPS = [
    "fc2.apps.PlatformAdminConfig",  # django.contrib.admin, branded, with the site's 403 for researchers
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "fc2",
    "recommender",
    "provisioner",
    "monitor",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Around everything that may reach the database or the broker (sessions, auth, views): a 503 while one is down.
    "fc2.outage.OutageMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Before the CSRF check, which would read (and spool) the whole body of a request refused anyway.
    "fc2.uploads.UploadLimitMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "fc2.urls"
WSGI_APPLICATION = "fc2.wsgi.application"
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
            ],
        },
    },
]

# Each process keeps its database connection between requests (DB_CONN_MAX_AGE seconds, 0: one per request): opening
# one cost more than the rest of a small API answer. A connection that broke meanwhile (a database restarted) is found
# at the start of the next request that uses it, and replaced, rather than failing that request.
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}",
        conn_max_age=envint("DB_CONN_MAX_AGE", 600),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory, so that the report server thread and worker processes see the test database too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 30, "transaction_mode": "IMMEDIATE"})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Django's own, but the signed-in user of each request is read with one prepared query (fc2.accounts.UserBackend);
# ModelBackend still reads the users of sessions signed in before it (their session names it), and checks no password.
AUTHENTICATION_BACKENDS = ["fc2.accounts.UserBackend", "django.contrib.auth.backends.ModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
# The "shared" cache is one every process of the platform sees (web workers, Celery): files under FC2_VAR_DIR, which
# they share already (uploads, artifacts, the embedded broker), and which, unlike a cache server, cannot be down.
# Sessions are read from it before the database (every signed-in request reads its session, and the query cost more
# than the rest of a small API answer; each change is still written to the database, so a session outlives the
# cache, and one signed out in a process ends in all), and the API's submit rate is counted in it (per token, whatever
# process answers). The default cache stays in each process's memory.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "shared": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(VAR_DIR / "cache"),
    },
}
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
SESSION_CACHE_ALIAS = "shared"

# Mail, which password reset needs: SMTP when EMAIL_HOST is set, else the console in development. With neither, no
# reset link could reach anyone, so the reset pages say to ask an administrator instead (FC2_EMAIL_ENABLED).
EMAIL_HOST = os.environ.get("EMAIL_HOST", "").strip()
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_PORT = envint("EMAIL_PORT", 587)
    EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = envsecret("EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", "true")  # STARTTLS on 587: the password never crosses in clear
    EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", "false")  # implicit TLS, port 465
    if EMAIL_USE_TLS and EMAIL_USE_SSL:
        raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are exclusive; set EMAIL_USE_TLS=false for SSL")
    EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 10)  # a dead mail server must not hold a web worker
elif DEBUG:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
# Without either, Django's default (SMTP on localhost:25) stays: anything that still tries to mail fails loudly.
FC2_EMAIL_ENABLED = bool(EMAIL_HOST) or DEBUG
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "webmaster@localhost")
SERVER_EMAIL = DEFAULT_FROM_EMAIL

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Personal API tokens (fc2/tokens.py) first: an unauthenticated request is then a 401 that names the scheme.
    # The browser's session too (with its CSRF token for writes); never HTTP Basic, a password in every script.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fc2.tokens.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Every refusal as {"error": reason} (and "fields" for invalid input), as docs/API.md says.
    "EXCEPTION_HANDLER": "fc2.rest.exception_handler",
    # DRF's parsers, JSON nested deeper than fc2.jsonbounds.MAX_JSON_DEPTH refused with a 400 (not a 500).
    "DEFAULT_PARSER_CLASSES": [
        "fc2.rest.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "FC² platform API",
    "DESCRIPTION": "Training jobs over HTTP (bundles, datasets, jobs, their logs and artifacts) and cluster "
    "recommendations (FC² and Anwar et al.). docs/API.md describes it.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The paths of /api/v1/ (docs/API.md), each route once; what follows the prefix names an operation's tag (its
    # resource: jobs, bundles, …) and the operation ids the views do not name themselves (me_retrieve).
    "PREPROCESSING_HOOKS": ["fc2.rest.v1_endpoints"],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # The API reference page (/api/docs) runs Swagger UI from the platform's own static files, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Choice sets that several fields share under one name in the schema.
    "ENUM_NAME_OVERRIDES": {
        "JobAlgorithmEnum": "fc2.jobs_serializers.JOB_ALGORITHMS",
        "JobStrategyEnum": "fc2.jobs_serializers.JOB_STRATEGIES",
        "JobStateEnum": "fc2.models.Job.State",
        "TrialStateEnum": "fc2.services.search.TRIAL_STATES",
    },
}

# Celery: Redis when REDIS_URL is set, otherwise the embedded broker (no server needed): kombu's filesystem transport
# with an atomic put and a get that sets an unreadable message aside (fc2/broker.py; kombu's own races itself).
REDIS_URL = os.environ.get("REDIS_URL", "")
# The filesystem transport ignores the host; naming one keeps kombu from warning "No hostname was supplied" at every
# connection, a warning nobody could act on.
CELERY_BROKER_URL = REDIS_URL or "filesystem://localhost/"
if not REDIS_URL:
    CELERY_BROKER_TRANSPORT = "fc2.broker:Transport"
    # One filesystem for all of them: messages move between them by rename.
    _broker_dir = VAR_DIR / "broker"
    for _folder in ("queue", "processed", "rejected", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "rejected_folder": str(_broker_dir / "rejected"),  # messages that could not be decoded, kept to be looked at
        "control_folder": str(_broker_dir / "control"),  # the worker's broadcast exchanges; default: ./control
        "store_processed": False,
        # How often an idle worker looks at the folder (kombu's default: every second). A worker at its prefetch
        # limit also waits this long before it takes the next message, so it bounds the worker's pace too.
        "polling_interval": 0.2,
    }
# JSON only, never pickle: the worker runs as root (the job sandbox needs it; see the Makefile's `run`).
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("FC2_QUEUE", "fc2")
# The sweep reconciles every unfinished job (fc2/services/sweep.py); a tick that has not started when the next is due
# is dropped rather than queued behind it.
CELERY_BEAT_SCHEDULE = {
    "fc2-sweep": {
        "task": "fc2.tasks.sweep",
        "schedule": FC2_SWEEP_INTERVAL_S,
        "options": {"expires": FC2_SWEEP_INTERVAL_S, "queue": CELERY_TASK_DEFAULT_QUEUE},
    },
    # Node samples of jobs that ended more than FC2_SAMPLE_FULL_DAYS ago kept a minute apart (monitor/retention.py).
    "fc2-compact-samples": {
        "task": "fc2.tasks.compact_samples",
        "schedule": 24 * 3600,
        "options": {"expires": 3600, "queue": CELERY_TASK_DEFAULT_QUEUE},
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# `make run` (manage.py serve) starts a web server or worker that died again, with backoff; one more end than
# FC2_SERVE_RESTARTS_PER_HOUR in an hour stops the platform. Stopping, it waits FC2_SERVE_STOP_S for them to exit
# before it kills what is left.
FC2_SERVE_RESTARTS_PER_HOUR = envint("FC2_SERVE_RESTARTS_PER_HOUR", 10)
FC2_SERVE_STOP_S = envint("FC2_SERVE_STOP_S", 5)

if not DEBUG:
    SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", "true")
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "false")
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
    X_FRAME_OPTIONS = "DENY"

# Quiet where nobody would act (fc2/logfilters.py): Celery's lines about the periodic tasks (the sweep's three every
# FC2_SWEEP_INTERVAL_S; a failing one still logs its error), and the server's warning for a node's late report
# answered 409.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "periodic_tasks": {
            "()": "fc2.logfilters.PeriodicTasks",
            "tasks": sorted({entry["task"] for entry in CELERY_BEAT_SCHEDULE.values()}),
        },
        "late_reports": {"()": "fc2.logfilters.LateReports"},
    },
    # Django's own formatter and handler for its server's request lines (django.utils.log.DEFAULT_LOGGING), named
    # again here because configuring the logger below replaces its handlers.
    "formatters": {
        "django.server": {"()": "django.utils.log.ServerFormatter", "format": "[{server_time}] {message}", "style": "{"}
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler"},
        "django.server": {"class": "logging.StreamHandler", "formatter": "django.server"},
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        # Without Django's console handler on "django": its lines reach the root's console once, not twice.
        "django": {"level": "INFO"},
        # paramiko says at INFO every connection and SFTP session it opens: the nodes' bootstrap logs say what matters.
        **{name: {"level": "WARNING"} for name in ("botocore", "boto3", "paramiko")},
        # beat's "Sending due task", the worker's "received" and the task's "succeeded in"
        **{
            name: {"filters": ["periodic_tasks"]}
            for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
        },
        # Django's server logger keeps its own handler (its request-line format); only the filter is added.
        "django.server": {
            "handlers": ["django.server"],
            "level": "INFO",
            "propagate": False,
            "filters": ["late_reports"],
        },
    },
}
