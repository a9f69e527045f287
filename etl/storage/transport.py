"""The one way to a store: the fsspec filesystem and the path within it of a URL, a missing
driver a one-line error that names what to install."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from etl.errors import EtlError, described

STORE_TIMEOUT = 60.0
"""Seconds one call to the store may take by default (`StoreOptions.timeout`)."""
Options = Mapping[str, Any]
"""fsspec driver options (endpoint, credentials; empty: the environment's), never written or
printed."""


STORE_PROTOCOLS = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")
"""The stores a URL may name without the user's word (NOTE [ no request nobody asked for ])."""
ALLOW_KEY = "etl:allow_protocols"
"""The key under which `with_allowed` carries a user's extra protocols in a store's options
(taken out before the options reach the driver)."""
ALLOW_ENV = "ETL_ALLOW_PROTOCOLS"
"""Extra protocols, comma-separated, for every store this process and its children reach
(`etl --allow-protocol P`)."""


def with_allowed(options: Options | None, protocols: Iterable[str]) -> dict[str, Any]:
    """`options` that also let `protocols` be reached (`filesystem`)."""
    merged = dict(options or {})
    extra = tuple(dict.fromkeys([*merged.get(ALLOW_KEY, ()), *protocols]))
    if extra:
        merged[ALLOW_KEY] = extra
    return merged


def check_protocol(url: str, extra: Iterable[str], error: type[EtlError]) -> None:
    """`error` unless `url`'s protocol is one of `STORE_PROTOCOLS`, or one the user allowed
    (`extra`, or `ETL_ALLOW_PROTOCOLS`).

    NOTE [ no request nobody asked for ]: a URL can come from a record, a state file, a view or
    a listing someone else wrote; fsspec would reach any protocol it knows (http:// to a cloud
    metadata service, a local host's port). A store protocol is the only kind read unless the
    user names another: `StoreOptions(allow_protocols=...)`, `source.allow_protocols` in
    pipeline.yaml, or `etl --allow-protocol P`."""
    protocol = url.split("://", 1)[0].lower()
    if not _known(protocol):
        return  # a typo (s4://): fsspec's own error names it
    allowed = {*STORE_PROTOCOLS, *extra}
    allowed.update(p.strip() for p in os.environ.get(ALLOW_ENV, "").split(",") if p.strip())
    if protocol in allowed:
        return
    raise error(
        f"{url}: {protocol}:// is not a store this reads unless asked ({', '.join(STORE_PROTOCOLS)}"
        f" are); to reach it: StoreOptions(allow_protocols=({protocol!r},)), "
        f"source.allow_protocols: [{protocol}] in pipeline.yaml, or etl --allow-protocol {protocol}"
    )


def _known(protocol: str) -> bool:
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return False  # fsspec is missing: `filesystem` says what to install
    return protocol in known_implementations or protocol in registry


def filesystem(url: str, options: Options | None, error: type[EtlError]) -> tuple[Any, str]:
    """(the fsspec filesystem, the path within it) of `url`; `error` naming `url` for a
    protocol not allowed (`check_protocol`), and the package to install when fsspec or the
    store's driver (s3fs, gcsfs, adlfs) is missing, or the scheme when fsspec knows no store
    by it (a typo: `s4://`)."""
    given = dict(options or {})
    check_protocol(url, given.pop(ALLOW_KEY, ()), error)
    try:
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(url, **given)
    except ImportError as exc:
        raise error(
            f"{url}: reading from object storage needs fsspec and the store's driver "
            f"({exc.name or exc}): pip install 'etl-memmap[s3]' (or gcsfs, adlfs)"
        ) from None
    except ValueError as exc:  # fsspec: "Protocol not known: s4"
        raise error(f"{url}: not a store fsspec knows ({exc})") from None
    return fs, str(path)


ENDPOINT_ENV = {
    "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "s3a": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "gs": ("STORAGE_EMULATOR_HOST",),
    "gcs": ("STORAGE_EMULATOR_HOST",),
}
"""Environment variables that point a protocol's driver at another endpoint."""
PLACE_OPTIONS = ("account_name", "account_host", "project")
"""Driver options (adlfs, gcsfs) that name where a bucket is, never a credential."""
AZURE = ("az", "abfs", "abfss")
CONNECTION_PLACES = ("AccountName", "BlobEndpoint")
"""The parts of an Azure connection string that name where a container is (never its key)."""

CONDITIONAL_PUTS = {
    "s3": "If-None-Match: *",
    "s3a": "If-None-Match: *",
    "gs": "ifGenerationMatch=0",
    "gcs": "ifGenerationMatch=0",
    **dict.fromkeys(AZURE, "If-None-Match: * (overwrite=False)"),
}
"""The protocols a dataset can be published to, and the precondition each driver sends for
`pipe_file(..., mode="create")` (s3fs, gcsfs, adlfs): a put that succeeds only while the key
does not exist (NOTE [ publishing to a store ] in `etl.storage.publish`). Tested against moto,
fake-gcs-server and Azurite (tests/storage/test_conditional_puts.py)."""


def unconditional(url: str) -> str | None:
    """Why a dataset cannot be published to `url` (a store whose driver has no put-if-absent:
    two writers could both publish a version), or None where it can."""
    protocol = url.split("://", 1)[0]
    if protocol in CONDITIONAL_PUTS:
        return None
    known = ", ".join(f"{p}://" for p in ("s3", "gs", "az", "abfs"))
    return (
        f"{url}: publishing needs a put that succeeds only if the object is absent, which "
        f"{protocol}:// does not offer here; publish to {known} or a local folder"
    )


def endpoint_of(url: str, options: Options) -> str | None:
    """Where the store of `url` is, when it is not the protocol's default, as text: its
    endpoint however given (`endpoint_url`, `client_kwargs`, the environment) and the options
    that name an account or project; None for the default. Two endpoints' `s3://bucket/ds`
    are two datasets: their caches must not mix."""
    client = options.get("client_kwargs")
    endpoint = options.get("endpoint_url") or options.get("endpoint")
    if not endpoint and isinstance(client, Mapping):
        endpoint = client.get("endpoint_url")
    protocol = url.split("://", 1)[0]
    for name in ENDPOINT_ENV.get(protocol, ()):
        endpoint = endpoint or os.environ.get(name)
    found = {key: options[key] for key in PLACE_OPTIONS if options.get(key)}
    if protocol in AZURE:
        found.update(_connection_places(options))
    if endpoint:
        found["endpoint"] = str(endpoint).rstrip("/")
    if not found:
        return None
    return ";".join(f"{key}={value}" for key, value in sorted(found.items()))


def _connection_places(options: Options) -> dict[str, str]:
    """Where an Azure connection string (given, or adlfs's environment variable) points:
    its account and blob endpoint, never its key."""
    text = options.get("connection_string") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if not isinstance(text, str):
        return {}
    parts = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    return {key: parts[key].rstrip("/") for key in CONNECTION_PLACES if parts.get(key)}


def why(exc: BaseException) -> str:
    """An exception as one line: its type and message (a driver's errors are often bare)."""
    return described(exc)
