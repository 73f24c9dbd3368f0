"""Build an ``ObjectStore`` from a URL and ``Settings``.

Supported: ``memory://``, ``file:///abs/path``, ``s3://bucket[/prefix]`` (S3, MinIO and other
S3-compatible stores), ``gs://bucket[/prefix]``, ``az://container[/prefix]`` (Azure Blob, or
Azurite with ``azure_use_emulator``). Each scheme's options come from ``Settings`` first, then
the provider's usual environment variables (``AWS_*``, ``AZURE_STORAGE_*``, ``GOOGLE_*``).

Opening a store creates nothing unless the caller says it may (``create=True``, which only
``Db.open`` passes): a mistyped ``file://`` path is reported, not made into a directory.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store

from slatepy.config import Settings
from slatepy.errors import InvalidArgument, NotFound, UnsupportedStore
from slatepy.store.attach import attach
from slatepy.store.base import ObjectStore
from slatepy.store.fsync import FileSync
from slatepy.store.local_read import LocalReads
from slatepy.store.obstore_store import ObstoreStore

if TYPE_CHECKING:
    from obstore.store import AzureConfig, ClientConfig, GCSConfig, RetryConfig, S3Config

SUPPORTED_SCHEMES = ("memory", "file", "s3", "gs", "az")

AZURITE_ACCOUNT = "devstoreaccount1"
"""The storage account every Azurite (the Azure Storage emulator) serves."""
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's well-known account key (public, documented by Microsoft; not a secret)."""
AZURITE_DEFAULT_URL = "http://127.0.0.1:10000"
"""Where Azurite's blob service listens unless told otherwise (``AZURITE_BLOB_STORAGE_URL``)."""

_TRUE = ("1", "true", "yes", "on")
_AZURE_KEY_VARIABLES = (
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
)


def open_store(url: str, settings: Settings | None = None, *, create: bool = False) -> ObjectStore:
    """Return the store a URL names, rooted at the URL's path.

    ``memory://`` is a new, empty store private to this call: two opens of ``memory://``
    never see each other's objects (pass the returned store itself to share it, e.g.
    ``Db.open(store)`` then ``DbReader.open(store)``).

    Args:
        url: The location (see the module docstring for the schemes).
        settings: Connection options, timeouts and retries; defaults to ``Settings()``.
        create: Whether the location may be created: a ``file://`` directory that does not
            exist is made (its new directories fsynced under ``file_sync="fsync"``). Only a
            writer creating a database passes True; readers, the CLI's admin commands and the
            garbage collector must not turn a typo into an empty database. Object stores
            (S3, GCS, Azure) have no directories and never create a bucket either way.

    Raises:
        UnsupportedStore: the scheme is not one of ``SUPPORTED_SCHEMES``.
        InvalidArgument: the URL is malformed (relative file path, missing bucket), or the
            ``file://`` path is not a usable directory.
        NotFound: ``create`` is False and the ``file://`` directory does not exist.
    """
    if not isinstance(url, str):
        raise InvalidArgument(f"store URL must be a str, got {type(url).__name__}")
    settings = settings or Settings()
    store = _open(url, settings, create=create)
    if settings.cas == "dynamodb":
        from slatepy.store.dynamodb import DynamoRecords
        from slatepy.store.twophase import TwoPhaseStore

        return TwoPhaseStore(store, DynamoRecords.from_settings(settings, namespace=store.url))
    return store


def _open(url: str, settings: Settings, *, create: bool) -> ObjectStore:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    client: ClientConfig = {
        "timeout": timedelta(seconds=settings.store_timeout),
        "connect_timeout": timedelta(seconds=settings.store_connect_timeout),
    }
    retry: RetryConfig = {
        "max_retries": settings.store_retries,
        "retry_timeout": timedelta(seconds=max(settings.store_timeout, 1.0)),
    }
    if scheme == "memory":
        return ObstoreStore(MemoryStore(), "memory://")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidArgument(f"file URLs need an absolute path (file:///abs/path): {url!r}")
        path = parts.path.rstrip("/") or "/"
        if not create and not os.path.isdir(path):
            if os.path.exists(path):
                raise InvalidArgument(f"file://{path} is not a directory")
            raise NotFound(
                f"no slatepy database at file://{path}: the directory does not exist "
                "(only Db.open creates a database)",
                path=path,
            )
        try:
            sync: FileSync | None = None
            if settings.file_sync != "off":
                # Creating the root ourselves makes its new directories durable.
                sync = FileSync.create_root(path) if create else FileSync(path)
                sync.file_only = settings.file_sync == "fsync-file"
            raw = LocalStore(path, mkdir=create)
        except Exception as exc:
            raise InvalidArgument(f"cannot use directory {path!r}: {exc}") from exc
        local = LocalReads(path, f"file://{path}")
        store = ObstoreStore(raw, f"file://{path}", file_sync=sync, local_reads=local)
        attach(store, path, create=create)  # before anything is read: RFC 0029
        return store
    bucket, prefix = parts.hostname or "", parts.path.strip("/") or None
    if scheme in ("gs", "az", "s3") and not bucket:
        raise InvalidArgument(f"{scheme}:// URLs need a bucket or container name: {url!r}")
    try:
        if scheme == "s3":
            return ObstoreStore(_s3(bucket, prefix, settings, client, retry), _strip(url))
        if scheme == "gs":
            return ObstoreStore(_gcs(bucket, prefix, settings, client, retry), _strip(url))
        if scheme == "az":
            return ObstoreStore(_azure(bucket, prefix, settings, client, retry), _strip(url))
    except InvalidArgument:
        raise
    except Exception as exc:
        raise InvalidArgument(f"cannot configure a store for {_strip(url)}: {exc}") from exc
    raise UnsupportedStore(
        f"unsupported store URL {url!r}: use one of "
        + ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES)
    )


def _s3(
    bucket: str,
    prefix: str | None,
    settings: Settings,
    client: ClientConfig,
    retry: RetryConfig,
) -> S3Store:
    env = os.environ
    endpoint = settings.s3_endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    config: S3Config = {
        "region": settings.s3_region
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or "us-east-1",
    }
    if endpoint:
        config["endpoint"] = endpoint
    key_id = settings.s3_access_key_id or env.get("AWS_ACCESS_KEY_ID")
    secret = settings.s3_secret_access_key or env.get("AWS_SECRET_ACCESS_KEY")
    if not (key_id and secret) and not _aws_chain_configured(settings):
        raise InvalidArgument(
            f"s3://{bucket}{'/' + prefix if prefix else ''} needs credentials and none are "
            "configured: set "
            "s3_access_key_id and s3_secret_access_key (SLATEPY_S3_ACCESS_KEY_ID, "
            "SLATEPY_S3_SECRET_ACCESS_KEY) or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
            "with an IAM role on EC2 set instance_credentials (SLATEPY_INSTANCE_CREDENTIALS="
            "true); for a public bucket AWS_SKIP_SIGNATURE=true (docs/configuration.md)"
        )
    if key_id and secret:
        config["access_key_id"] = key_id
        config["secret_access_key"] = secret
        token = settings.s3_session_token or env.get("AWS_SESSION_TOKEN")
        if token:
            config["session_token"] = token
    allow_http = settings.s3_allow_http
    if allow_http is None:
        allow_http = bool(endpoint and endpoint.startswith("http://"))
    return S3Store(
        bucket,
        prefix=prefix,
        config=config,
        client_options={**client, "allow_http": allow_http},
        retry_config=retry,
    )


def _azure(
    container: str,
    prefix: str | None,
    settings: Settings,
    client: ClientConfig,
    retry: RetryConfig,
) -> AzureStore:
    """An ``AzureStore`` configured from ``azure_*`` settings, then the ``AZURE_*`` variables.

    With ``azure_use_emulator`` (or ``AZURE_STORAGE_USE_EMULATOR=true``) the account and key
    default to Azurite's well-known ones and the endpoint to
    ``$AZURITE_BLOB_STORAGE_URL/devstoreaccount1`` (``http://127.0.0.1:10000/...``), but an
    explicit ``azure_endpoint`` wins, so an Azurite on any port works. obstore's own emulator
    switch is always passed as off: it would ignore the endpoint in favour of the environment.

    Raises:
        InvalidArgument: no storage account is configured.
    """
    env = os.environ
    emulator = settings.azure_use_emulator
    if emulator is None:
        emulator = env.get("AZURE_STORAGE_USE_EMULATOR", "").strip().lower() in _TRUE
    account = settings.azure_account or env.get("AZURE_STORAGE_ACCOUNT_NAME")
    key = settings.azure_access_key or next(
        (env[k] for k in _AZURE_KEY_VARIABLES if env.get(k)), None
    )
    endpoint = (
        settings.azure_endpoint or env.get("AZURE_STORAGE_ENDPOINT") or env.get("AZURE_ENDPOINT")
    )
    if emulator:
        account = account or AZURITE_ACCOUNT
        key = key or AZURITE_KEY
        if not endpoint:
            base = env.get("AZURITE_BLOB_STORAGE_URL") or AZURITE_DEFAULT_URL
            endpoint = f"{base.rstrip('/')}/{account}"
    if not account:
        raise InvalidArgument(
            "az:// needs an Azure storage account (Account name missing): set azure_account "
            "(SLATEPY_AZURE_ACCOUNT) or AZURE_STORAGE_ACCOUNT_NAME, or azure_use_emulator "
            "(AZURE_STORAGE_USE_EMULATOR=true) for Azurite"
        )
    # Other credentials (SAS, tokens, managed identity) come from obstore's AZURE_* reading.
    config: AzureConfig = {"account_name": account, "use_emulator": False}
    if key:
        config["account_key"] = key
    if endpoint:
        config["endpoint"] = endpoint
    allow_http = bool(endpoint and endpoint.startswith("http://"))
    return AzureStore(
        container,
        prefix=prefix,
        config=config,
        client_options={**client, "allow_http": allow_http},
        retry_config=retry,
    )


def _gcs(
    bucket: str,
    prefix: str | None,
    settings: Settings,
    client: ClientConfig,
    retry: RetryConfig,
) -> GCSStore:
    """A ``GCSStore``; ``gcs_endpoint`` (then ``GOOGLE_BASE_URL``) points it at an emulator.

    Credentials are obstore's: ``GOOGLE_SERVICE_ACCOUNT*``, ``GOOGLE_APPLICATION_CREDENTIALS``
    or ``GOOGLE_BEARER_TOKEN``, gcloud's application-default file, else (only with
    ``instance_credentials``) the instance metadata server.

    Raises:
        InvalidArgument: no credentials are configured.
    """
    endpoint = settings.gcs_endpoint or os.environ.get("GOOGLE_BASE_URL")
    if not _gcs_configured(settings):
        raise InvalidArgument(
            f"gs://{bucket}{'/' + prefix if prefix else ''} needs credentials and none are "
            "configured: set "
            "GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT / _PATH / _KEY) to a "
            "service-account key, or run `gcloud auth application-default login`; on GCE "
            "with a service account set instance_credentials (SLATEPY_INSTANCE_CREDENTIALS="
            "true) (docs/configuration.md)"
        )
    config: GCSConfig = {}
    if endpoint:
        config["base_url"] = endpoint
    allow_http = bool(endpoint and endpoint.startswith("http://"))
    return GCSStore(
        bucket,
        prefix=prefix,
        config=config,
        client_options={**client, "allow_http": allow_http},
        retry_config=retry,
    )


_AWS_CHAIN_VARIABLES = (
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)
"""Variables that say where the AWS credential chain finds a role (ECS, EKS): their
presence is configuration, unlike the bare EC2 metadata server the chain ends with."""

_GCS_CREDENTIAL_VARIABLES = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
)


def _aws_chain_configured(settings: Settings) -> bool:
    """Whether S3 credentials other than static keys are configured: an explicit opt-in to
    the instance metadata server, a container or web-identity role, or unsigned requests."""
    env = os.environ
    return (
        settings.instance_credentials
        or any(env.get(name) for name in _AWS_CHAIN_VARIABLES)
        or env.get("AWS_SKIP_SIGNATURE", "").strip().lower() in _TRUE
    )


def _gcs_configured(settings: Settings) -> bool:
    """Whether GCS credentials are configured (variables, gcloud's application-default file,
    an emulator endpoint, or the opt-in to the metadata server)."""
    env = os.environ
    if settings.instance_credentials or settings.gcs_endpoint or env.get("GOOGLE_BASE_URL"):
        return True
    if any(env.get(name) for name in _GCS_CREDENTIAL_VARIABLES):
        return True
    home = env.get("CLOUDSDK_CONFIG") or os.path.join(os.path.expanduser("~"), ".config", "gcloud")
    return os.path.isfile(os.path.join(home, "application_default_credentials.json"))


def _strip(url: str) -> str:
    """Drop any user-info from a URL before it goes into messages or logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{parts.path}"
