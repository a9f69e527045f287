"""The `webdataset` kind: tar shards whose members are grouped into samples by key. Each tar is
read once, in order, in this process; an uncompressed tar's members are read by the workers in
place, a compressed one's are spooled (NOTE [spool] in etl/sources/spool.py)."""

from __future__ import annotations

import json
import lzma
import os
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from etl.config import WebDatasetSource
from etl.format import names
from etl.sources.containers import (
    check_container_folder,
    declared_classes,
    duplicate_in,
    match_files,
    opened_file,
    record_source,
)
from etl.sources.entries import ListContext, SourceListing
from etl.sources.intake import RecordIntake
from etl.sources.kind import SourceKind
from etl.sources.labels import class_name_of
from etl.sources.safe_files import too_large
from etl.sources.spool import read_slice

if TYPE_CHECKING:
    from etl.format.sample_columns import SampleColumn

# --- files --------------------------------------------------------------------------------------


TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError)
"""What reading a damaged, truncated or mislabelled (compressed) tar raises."""

_INTEGER = re.compile(r"\s*-?\d+\s*")


@dataclass
class _Sample:
    """The members of one key seen so far: the bytes of those the sample needs."""

    key: bytes
    data: dict[str, bytes] = field(default_factory=dict)
    at: dict[str, str] = field(default_factory=dict)
    """Where workers read a member in place (an uncompressed tar), by extension."""
    extensions: list[str] = field(default_factory=list)
    problem: tuple[str, str] | None = None


def list_webdataset(config: WebDatasetSource, context: ListContext) -> SourceListing:
    """Every sample of every tar shard `config.files` matches (plain, .gz, .bz2 or .xz)."""
    matched = match_files(config.path, config.files, config.storage_options)
    with RecordIntake(context) as intake:
        for relative, split in matched:
            with opened_file(config.path, relative, intake, config.storage_options) as f:
                if f is not None:
                    _take_shard(f, relative, split, config, intake)
    classes = None if config.classes else declared_classes(intake, None)
    return intake.listing(duplicate_in((r for r, _ in matched), "key"), classes)


def _take_shard(
    f: IO[bytes], relative: str, split: str | None, config: WebDatasetSource, intake: RecordIntake
) -> None:
    shard = names.path_to_source(relative)
    path = os.path.join(config.path, relative)
    wanted = {*config.image_extensions, config.label_member.lower(), *_members(intake.columns)}
    finished: set[bytes] = set()
    twice: set[bytes] = set()
    sample: _Sample | None = None
    try:
        # NOTE: a seekable mode, not a stream ('r|*'): skipping a member seeks, and a seek
        # past the end is an error, so a shard cut inside a skipped member is still found
        with tarfile.open(fileobj=f, mode="r:*") as tar:
            # not compressed, on local disk: workers read members from the file (from object
            # storage, they read the spool: this process has read every byte once already)
            in_place = tar.fileobj is f and not isinstance(config.path, str)
            for member in tar:
                if member.isdir():
                    continue
                name = os.fsencode(member.name)
                while name.startswith(b"./"):
                    name = name[2:]
                key, extension = _split_name(name)
                if sample is None or key != sample.key:
                    if sample is not None:
                        _take_sample(sample, relative, split, config, intake)
                        finished.add(sample.key)
                    sample = _Sample(key)
                    if key in finished:
                        twice.add(key)
                at = path if in_place else None
                if _take_member(tar, member, name, extension, sample, wanted, config, at):
                    twice.add(key)
    except TAR_ERRORS as exc:
        cut = isinstance(exc, EOFError) or "unexpected end" in str(exc)
        reason, what = ("truncated", "ends early") if cut else ("unreadable", "cannot be read")
        intake.reject(shard, reason, f"{relative}: the tar {what} ({' '.join(str(exc).split())})")
        if sample is not None:  # its members may be cut short
            intake.reject(
                record_source(relative, sample.key), reason, f"the tar {what} inside this sample"
            )
            sample = None
    if sample is not None:
        _take_sample(sample, relative, split, config, intake)
    if twice:
        intake.withdraw(
            {record_source(relative, key) for key in twice},
            "duplicate_key",
            f"the key appears more than once in {relative}",
        )


def _take_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    name: bytes,
    extension: str,
    sample: _Sample,
    wanted: set[str],
    config: WebDatasetSource,
    at: str | None,
) -> bool:
    """Read one member of `sample` that it wants (a member's image, label or column), or say
    why the sample cannot be one: a name that leads outside the shard, a link or special
    file, one too large. `at`: the shard's path on local disk, where workers read members in
    place. Whether the sample already had a member of this extension (its key is twice)."""
    sample.extensions.append(extension)
    if PurePosixPath(os.fsdecode(name)).is_absolute() or b".." in name.split(b"/"):
        sample.problem = (
            "outside_root",
            f"member {member.name!r} leads outside the shard (never extracted)",
        )
    if extension not in wanted or sample.problem is not None:
        return False
    if extension in sample.data:
        return True
    if not member.isfile():
        what = "a link" if member.issym() or member.islnk() else "not a regular file"
        sample.problem = ("not_a_file", f"member {member.name!r} is {what} (not read)")
    elif member.size > config.max_file_bytes:
        why = too_large(member.size, config.max_file_bytes)
        sample.problem = ("file_too_large", f"member {member.name!r}: {why}")
    else:
        reader = tar.extractfile(member)
        assert reader is not None  # a regular member
        sample.data[extension] = reader.read()
        if at is not None:
            sample.at[extension] = f"{member.offset_data}+{member.size}@{at}"
    return False


def _split_name(name: bytes) -> tuple[bytes, str]:
    """(key, extension) of a member name: the key runs up to the first dot of the last part
    (a name without one is all key)."""
    slash = name.rfind(b"/") + 1
    dot = name.find(b".", slash)
    if dot <= slash:
        return name, ""
    return name[:dot], name[dot + 1 :].decode("utf-8", "replace").lower()


def _take_sample(
    sample: _Sample,
    relative: str,
    split: str | None,
    config: WebDatasetSource,
    intake: RecordIntake,
) -> None:
    source = record_source(relative, sample.key)
    if sample.problem is not None:
        intake.reject(source, *sample.problem)
        return
    extension = next((e for e in config.image_extensions if e in sample.data), None)
    if extension is None:
        has = ", ".join(sorted(set(sample.extensions))) or "none"
        intake.reject(
            source,
            "no_image",
            f"no member with extension {', '.join(config.image_extensions)} (has: {has})",
        )
        return
    image = sample.data[extension]
    label_data = sample.data.get(config.label_member.lower())
    if label_data is None:
        intake.reject(source, "unknown_label", f"no .{config.label_member} member", image)
        return
    try:
        class_name = class_name_of(_label_value(label_data, config), config.classes)
    except (ValueError, TypeError, KeyError) as exc:
        intake.reject(source, "unknown_label", f".{config.label_member}: {exc}", image)
        return
    if class_name is None:
        intake.reject(source, "unknown_label", f".{config.label_member} is empty", image)
        return
    record = None
    if intake.columns:
        from etl.format.sample_columns import BadValue  # NOTE: here: it imports pyarrow

        try:
            record = _record(sample, intake.columns)
        except BadValue as exc:
            intake.reject(source, "bad_column", str(exc), image)
            return
    intake.add(source, image, class_name, split, sample.at.get(extension), record)


JSON_MEMBER = "json"
"""The member whose object holds the declared columns that do not name a member ('.txt')."""


def _members(columns: tuple[SampleColumn, ...]) -> set[str]:
    """The extensions of the members the declared columns are read from."""
    return {c.key[1:].lower() if c.key.startswith(".") else JSON_MEMBER for c in columns}


def _record(sample: _Sample, columns: tuple[SampleColumn, ...]) -> dict[str, Any]:
    """The declared columns' values of a sample, by key: a '.ext' key is the text of that
    member (a number or JSON as its column's type needs), any other a field of the sample's
    .json object. A member that is not UTF-8, or JSON that is not an object, is `BadValue`."""
    from etl.format.sample_columns import BadValue, from_text

    record: dict[str, Any] = {}
    data: Any = None
    for column in columns:
        extension = column.key[1:].lower() if column.key.startswith(".") else JSON_MEMBER
        raw = sample.data.get(extension)
        try:
            text = None if raw is None else raw.decode("utf-8")
            if column.key.startswith("."):
                record[column.key] = from_text(text, column.type)
                continue
            if data is None and text is not None:
                data = json.loads(text)
                if not isinstance(data, dict):
                    raise BadValue(f"holds a JSON {type(data).__name__}, not an object")
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError
            raise BadValue(f"column {column.name!r}: the .{extension} member: {exc}") from None
        record[column.key] = (data or {}).get(column.key)
    return record


def _label_value(data: bytes, config: WebDatasetSource) -> Any:
    """The label a member holds: a field of a JSON object, or text (an integer as an int)."""
    text = data.decode("utf-8")
    if config.label_field is not None:
        record = json.loads(text)
        if not isinstance(record, dict) or config.label_field not in record:
            raise KeyError(f"no field {config.label_field!r} in the JSON object")
        return record[config.label_field]
    return int(text) if _INTEGER.fullmatch(text) else text


KIND = SourceKind(
    name="webdataset",
    list=list_webdataset,
    read=read_slice,  # an uncompressed tar's member in place, a compressed one's from the spool
    check=check_container_folder,
    by_path=False,
    in_place=False,
    columns=True,
)
