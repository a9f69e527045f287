"""An LMDB source's `keys_entry`: the value listing the keys to pack, read one key at a time.

The entry is the user's own format: a JSON array of strings, one key per line, or (with
allow_pickle) a pickled list. A JSON array or text of 10M keys parsed at once is 10M Python
strings, and checking them for repeats with a Counter was another dict of 10M: about 2 GB.
Here the text is walked twice (once to check every key, once to list them) and repeats are
found among 128-bit hashes in a numpy array, 16 bytes a key.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import xxhash

from etl.config import LmdbSource
from etl.errors import SourceError
from etl.format import names
from etl.sources.payloads import PICKLE_ADVICE, UNPICKLE_ERRORS, is_pickle

_WHITESPACE = re.compile(r"[ \t\n\r]*")
"""What JSON allows between tokens."""
_LINE = re.compile(r"[^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")
"""A line's text: what `str.splitlines` splits on, excluded."""
_CHUNK = 1 << 13


def listed_keys(raw: bytes, config: LmdbSource, where: str) -> Iterator[bytes]:
    """The raw LMDB keys the entry `raw` lists, in its order, each checked before the first is
    given: a SourceError (naming `where`) for an entry that is not a list of key strings, a
    name that is no key, or a key listed twice."""
    spellings = _spellings(raw, config, where)
    hashes = []
    chunk: list[bytes] = []
    for key in _raw_keys(spellings(), where):
        chunk.append(xxhash.xxh3_128_digest(key))
        if len(chunk) == _CHUNK:
            hashes.append(np.array(chunk, dtype="S16"))
            chunk = []
    hashes.append(np.array(chunk, dtype="S16"))
    every = np.concatenate(hashes)
    del hashes[:]
    every.sort()
    # NOTE: numpy drops an 'S' value's trailing zero bytes when it gives it back; put them back
    twice = {h.ljust(16, b"\0") for h in every[1:][every[1:] == every[:-1]].tolist()}
    if twice:
        dupes = {
            names.to_source(key)
            for key in _raw_keys(spellings(), where)
            if xxhash.xxh3_128_digest(key) in twice
        }
        raise SourceError(f"{where} lists keys twice: {sorted(dupes)[:5]}")
    return _raw_keys(spellings(), where)


def _raw_keys(spellings: Iterator[str | bytes], where: str) -> Iterator[bytes]:
    for name in spellings:
        if isinstance(name, bytes):
            yield name
            continue
        try:
            yield names.to_raw(name)
        except ValueError as exc:
            raise SourceError(f"{where}: {exc}") from None


def _spellings(raw: bytes, config: LmdbSource, where: str) -> Callable[[], Iterator[Any]]:
    """A function giving the entry's keys one at a time, as often as it is called."""
    if is_pickle(raw):
        if not config.allow_pickle:
            raise SourceError(f"{where} is a Python pickle: refused; {PICKLE_ADVICE}")
        try:
            listed: Any = pickle.loads(raw)  # allowed explicitly by the config (allow_pickle)
        except UNPICKLE_ERRORS as exc:
            raise SourceError(f"{where}: cannot unpickle ({exc})") from None
        if not isinstance(listed, list | tuple):
            raise SourceError(f"{where}: expected a list of key strings")
        return lambda: _checked(iter(listed), (str, bytes), where)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{where}: not UTF-8 text, JSON or a pickle") from None
    start = _WHITESPACE.match(text).end()  # type: ignore[union-attr]
    if text.startswith("[", start):
        return lambda: _checked(_json_items(text, start + 1, where), (str,), where)
    return lambda: (stripped for m in _LINE.finditer(text) if (stripped := m.group().strip()))


def _checked(items: Iterator[Any], types: tuple[type, ...], where: str) -> Iterator[Any]:
    for item in items:
        if not isinstance(item, types):
            raise SourceError(f"{where}: expected a list of key strings, found {item!r:.40}")
        yield item


def _json_items(text: str, at: int, where: str) -> Iterator[Any]:
    """The items of the JSON array whose '[' ends before `at`, decoded one at a time (with
    json's own decoder), then nothing but whitespace to the end."""
    decode = json.JSONDecoder().raw_decode
    at = _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]
    closed = text.startswith("]", at)
    while not closed:
        try:
            item, at = decode(text, at)
        except json.JSONDecodeError as exc:
            raise SourceError(f"{where}: invalid JSON ({exc})") from None
        yield item
        at = _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]
        closed = text.startswith("]", at)
        if not closed:
            if at == len(text):
                raise SourceError(f"{where}: invalid JSON (the list has no closing ']')")
            if not text.startswith(",", at):
                raise SourceError(f"{where}: invalid JSON (expected ',' or ']' at char {at})")
            at = _WHITESPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    end = _WHITESPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    if end != len(text):
        raise SourceError(f"{where}: invalid JSON (extra data after the list at char {end})")
