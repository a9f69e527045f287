"""The commit record: `versions/vNNNNNN/commit.json`, the size and BLAKE3 digest of every other
file of a version, itself sealed by a digest of its own canonical JSON.

Shards carry checksums in shards.arrow, but nothing checked the Arrow files themselves: a byte
flipped in manifest.arrow could turn a height from 386 into 65154 and still read as a valid
table. With the record, `read_manifest` refuses a version whose files changed after the commit,
and `etl audit` names each such file.

The record is plain JSON (any tool reads it); `record` is the BLAKE3 of the JSON text of the
other keys, dumped with sorted keys and no spaces, so a change to the record itself shows too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from etl.format.checksums import TAMPER_DIGEST, digest, file_digests

RECORD_FILE = "commit.json"
RECORD_FORMAT = 1


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_record(folder: Path, version: int, files: tuple[str, ...]) -> None:
    """Record `files` of `folder` (already written and flushed) in `folder/commit.json`."""
    body: dict[str, Any] = {
        "record_format": RECORD_FORMAT,
        "version": version,
        "algorithm": TAMPER_DIGEST,
        "files": {
            name: {
                "bytes": (folder / name).stat().st_size,
                TAMPER_DIGEST: file_digests(folder / name, (TAMPER_DIGEST,), all_cores=True)[0],
            }
            for name in files
        },
    }
    body["record"] = digest(_canonical(body), TAMPER_DIGEST)
    path = folder / RECORD_FILE
    with open(path, "wb") as f:
        f.write(json.dumps(body, sort_keys=True, indent=1).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def check_record(folder: Path, version: int, files: tuple[str, ...]) -> list[str]:
    """What does not match `folder/commit.json`, one message per damaged or changed file
    (empty when all is well). A missing, unreadable or self-inconsistent record is one message."""
    where = folder.parent.name + "/" + folder.name
    try:
        body = json.loads((folder / RECORD_FILE).read_bytes())
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        sealed = body.pop("record")
        recorded = body["files"]
        if not isinstance(recorded, dict):
            raise ValueError("'files' is not an object")
    except FileNotFoundError:
        return [f"{where}/{RECORD_FILE}: missing (the commit record of this version)"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return [f"{where}/{RECORD_FILE}: unreadable ({exc})"]
    if body.get("algorithm") != TAMPER_DIGEST or sealed != digest(_canonical(body), TAMPER_DIGEST):
        return [f"{where}/{RECORD_FILE}: changed after the commit (its own digest fails)"]
    if body.get("version") != version:
        return [f"{where}/{RECORD_FILE}: records version {body.get('version')}, not {version}"]
    problems = []
    for name in files:
        entry = recorded.get(name)
        path = folder / name
        if not isinstance(entry, dict):
            problems.append(f"{where}/{name}: not in {RECORD_FILE}")
            continue
        try:
            size = path.stat().st_size
            matches = size == entry["bytes"]
            actual = file_digests(path, (TAMPER_DIGEST,), all_cores=True)[0] if matches else None
        except OSError as exc:
            problems.append(f"{where}/{name}: unreadable ({exc.strerror or exc})")
            continue
        if size != entry["bytes"]:
            problems.append(f"{where}/{name}: {size} bytes, the commit recorded {entry['bytes']}")
        elif actual != entry.get(TAMPER_DIGEST):
            problems.append(f"{where}/{name}: bytes changed after the commit ({TAMPER_DIGEST})")
    return problems


FILES_AT = "files_at"
"""A record key set by a version published to object storage: the hidden folder, beside the
version's own, that holds its other files (NOTE [ publishing to a store ] in
etl.storage.publish). Sealed with the rest; local readers ignore it."""


def relocated(folder: Path, files_at: str) -> bytes:
    """`folder/commit.json` (already checked) with `files_at` added and the seal made again:
    the record a store's version is published with."""
    body = json.loads((folder / RECORD_FILE).read_bytes())
    body.pop("record")
    body[FILES_AT] = files_at
    body["record"] = digest(_canonical(body), TAMPER_DIGEST)
    return json.dumps(body, sort_keys=True, indent=1).encode() + b"\n"
