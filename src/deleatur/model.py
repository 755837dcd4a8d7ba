"""Plain, validated domain types: spaces, records and what a caller writes."""

from __future__ import annotations

import enum
import functools
import json
import math
import os
import re
import sys
import threading
import unicodedata
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .clock import LATEST, from_isoformat, isoformat
from .errors import InvalidInputError

DEFAULT_MAX_TEXT_BYTES = 64 * 1024
_NAME_MAX = 256
_WS = re.compile(r"\s+")


class Status(enum.StrEnum):
    ACTIVE = "ACTIVE"
    RETIRED = "RETIRED"
    SUPERSEDED = "SUPERSEDED"


#: General category Cc (control): these 65 code points, a set Unicode's stability policy
#: fixes for good, so a character class finds them (a category lookup per character
#: took a third of validating a space).
_CONTROLS = [*range(0x00, 0x20), *range(0x7F, 0xA0)]


@functools.cache
def _controls_but(but: str) -> re.Pattern[str]:
    return re.compile("[" + "".join(re.escape(chr(c)) for c in _CONTROLS if chr(c) not in but) + "]")


def _has_controls(value: str, *, but: str = "") -> bool:
    """Whether ``value`` holds a control character other than those in ``but``."""
    return _controls_but(but).search(value) is not None


def _check_utf8(value: str, what: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates: what Python makes of undecodable bytes in argv or files.
        raise InvalidInputError(f"{what} is not valid UTF-8") from None


#: The longest free-text note kept beside the records (a reason, a legal basis), in UTF-8 bytes.
MAX_NOTE_BYTES = 4096


def check_note(value: str, what: str, *, max_bytes: int = MAX_NOTE_BYTES) -> str:
    """A free-text note (a reason, a legal basis, a decision's summary, an actor or a
    requester, which the servers fill with the caller's principal name): valid UTF-8, as
    everything stored must be to be read back, with no control characters but tabs and
    line breaks, and at most ``max_bytes``. Blank ones are the caller's to refuse."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string")
    _check_utf8(value, what)
    if len(value.encode("utf-8")) > max_bytes:
        raise InvalidInputError(f"{what} is over the {max_bytes}-byte limit")
    if _has_controls(value, but="\t\n\r"):
        raise InvalidInputError(f"{what} contains control characters")
    return value


def check_stated(value: object, what: str, *, missing: str, max_bytes: int = MAX_NOTE_BYTES) -> str:
    """A note a call must be given (a reason, a legal basis, a summary): ``missing`` if
    it is not text or is blank, then :func:`check_note`."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(missing)
    return check_note(value, what, max_bytes=max_bytes)


#: The longest actor or requester: room for the servers' '<named> (via <principal>)'.
MAX_WHO_CHARS = 512


def one_line(value: str) -> str:
    """``value`` as one line: each control character (a line break, a tab) a space, and
    each run of spaces one, trimmed. How an actor or requester stored before it had to be
    one line is read today (a principal's name, a retried request's requester)."""
    shown = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in value)
    return " ".join(shown.split())


def check_who(value: object, what: str, *, missing: str) -> str:
    """Who acted (an actor) or asked (a requester), trimmed: one line, since a line
    break would let a record or an audit view show someone else on a line of its own
    (a tab stays: a principal named before names refused it may hold one). ``missing``
    is the message for a blank one."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(missing)
    value = value.strip()
    _check_utf8(value, what)
    if len(value) > MAX_WHO_CHARS:
        raise InvalidInputError(f"{what} is longer than {MAX_WHO_CHARS} characters")
    if _has_controls(value, but="\t"):
        raise InvalidInputError(f"{what} contains control characters (it is one line of text)")
    return value


def check_query(query: object) -> str:
    """A recall query: text, and valid UTF-8 like everything that is stored."""
    if not isinstance(query, str):
        raise InvalidInputError("query must be a string")
    _check_utf8(query, "query")
    return query


def check_tenant(value: str) -> str:
    """A tenant name: the rules of a user id, under its own name in errors."""
    return check_name(value, "tenant", allow_empty=False)


def check_name(value: str, what: str, *, allow_empty: bool) -> str:
    """A name (a subject, a key, an id): valid UTF-8, at most 256 characters, and no
    control characters at all, unlike a note: a name is one line."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string")
    _check_utf8(value, what)
    if not allow_empty and not value:
        raise InvalidInputError(f"{what} must not be empty")
    if len(value) > _NAME_MAX:
        raise InvalidInputError(f"{what} is longer than {_NAME_MAX} characters")
    if _has_controls(value):
        raise InvalidInputError(f"{what} contains control characters")
    return value


def canonical_subject(original: str) -> str:
    """NFKC, case-folded, trimmed, inner whitespace collapsed.

    NFKC runs again after case folding because folding can produce
    non-normalized sequences; the result is a fixed point of this function.
    """
    if not isinstance(original, str):
        raise InvalidInputError("subject must be a string")
    return _canonical(original)


#: The store setting in which every erasure counts itself, in its own transaction: a
#: connection that sees the count change empties its process's caches of names
#: (Memory._refresh), as the erasing process does at once.
ERASURES_MADE = "erasures.made"

#: The store setting in which every hard removal of records (an erasure's, a purge's, a
#: rectification's erase-previous) counts itself, in its transaction: a stream reading
#: the store a page at a time reads its page again, without what went, when it moves.
REMOVALS_MADE = "records.removed"


def forget_cached_names() -> None:
    """Empty the process's caches of names (subjects, user ids, spaces, and every
    :class:`NameCache`), and count it (:func:`names_forgotten`): an erasure calls it, so
    an erased name does not outlive the erasure there."""
    _empty_name_caches()
    _FORGOTTEN[0] += 1


def _empty_name_caches() -> None:
    _canonical.cache_clear()
    cached_space.cache_clear()
    with _NAME_CACHES_HELD:
        caches = list(_NAME_CACHES.values())
    for cache in caches:
        cache.clear()


_FORGOTTEN = [0]  # a count updated in place: module state, as the caches are


def names_forgotten() -> int:
    """How many times this process has emptied its caches of names. What read the store
    as it was before one of them (a call or a stream that began before, a read snapshot)
    may have put an erased name back: it ends with :func:`forget_names_again_since`."""
    return _FORGOTTEN[0]


def forget_names_again_since(count: int) -> None:
    """Empty the caches of names again if an erasure has emptied them since ``count`` (a
    :func:`names_forgotten`). Not counted: this removes no name that work begun after
    the erasure could have read, so counting it would have every call then in flight
    empty the caches again as it ends, and so on while calls overlap."""
    if _FORGOTTEN[0] != count:
        _empty_name_caches()


class NameCache(dict[tuple[str, ...], str]):
    """A cache whose keys hold names (a store handle's tokens of user ids and spaces):
    :func:`forget_cached_names` empties every one alive."""

    def __init__(self) -> None:
        super().__init__()
        with _NAME_CACHES_HELD:
            _NAME_CACHES[id(self)] = self


# By identity (a dict is not hashable), held weakly: a cache lives as long as its owner.
# Handles are opened, and erasures made, in any thread.
_NAME_CACHES: weakref.WeakValueDictionary[int, NameCache] = weakref.WeakValueDictionary()
_NAME_CACHES_HELD = threading.Lock()


@functools.lru_cache(maxsize=8192)  # every write canonicalizes its subject, mostly a known one
def _canonical(original: str) -> str:
    check_name(original, "subject", allow_empty=True)
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", original).casefold())
    canonical = _WS.sub(" ", folded).strip()
    if not canonical:
        raise InvalidInputError("subject must not be empty")
    return canonical


def canonical_key(original: str) -> str:
    """Fact-slot keys get the same folding as subjects: `Alice::Phone` is `alice::phone`."""
    check_name(original, "key", allow_empty=True)
    canonical = canonical_subject(original) if original.strip() else ""
    if not canonical:
        raise InvalidInputError("key must not be empty")
    return canonical


#: A scope whose user an account erasure reached: this prefix, then the user's blind
#: reference in hex, never the name (see access.principals). It still covers that user id.
ERASED_USER = "erased-user:"
_MARKER = re.compile(re.escape(ERASED_USER) + "[0-9a-f]{32}")


def erased_ref(scope: str) -> bytes | None:
    """The blind reference an erased user's scope marker holds; None for anything else,
    such as a user id that merely starts like one (older stores may hold such ids)."""
    return bytes.fromhex(scope.removeprefix(ERASED_USER)) if _MARKER.fullmatch(scope) else None


def _check_user_id(value: str) -> None:
    check_name(value, "user_id", allow_empty=False)
    if erased_ref(value) is not None:
        # Such a space would be covered by the erased user's old keys, audited as theirs.
        raise InvalidInputError("user_id may not be an erased user's marker (erased-user: and a reference)")


@dataclass(frozen=True, slots=True)
class Space:
    """Where a memory lives inside a tenant. Matching is exact on all three parts."""

    user_id: str = "default"
    agent_id: str = ""
    run_id: str = ""

    def __post_init__(self) -> None:
        _check_user_id(self.user_id)
        check_name(self.agent_id, "agent_id", allow_empty=True)
        check_name(self.run_id, "run_id", allow_empty=True)


# Rows of one space share one validated Space: validating three names per row read
# was an eighth of a recall. Emptied by forget_cached_names.
cached_space = functools.lru_cache(maxsize=4096)(Space)


def validate_text(text: str, max_bytes: int = DEFAULT_MAX_TEXT_BYTES) -> str:
    if not isinstance(text, str):
        raise InvalidInputError("text must be a string")
    _check_utf8(text, "text")
    if not text.strip():
        raise InvalidInputError("text must not be empty")
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInputError(f"text is {size} bytes, over the {max_bytes}-byte limit")
    # As for notes: a memory is text. An escape sequence stored in one would run in the
    # terminal of whoever lists it later.
    if _has_controls(text, but="\t\n\r"):
        raise InvalidInputError("text contains control characters (only tabs and line breaks are allowed)")
    return text


MAX_METADATA_DEPTH = 32


def validate_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError("metadata must be a JSON object")
    if not metadata:
        return {}  # what the round trip below makes of it (most writes carry none)
    try:
        # Round-trip through strict JSON so what is stored is exactly what export returns.
        encoded = json.dumps(dict(metadata), allow_nan=False, ensure_ascii=False)
        encoded.encode("utf-8")
    except RecursionError:
        raise InvalidInputError(f"metadata is nested more than {MAX_METADATA_DEPTH} levels deep") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"metadata is not valid JSON: {exc}") from None
    if json_depth(metadata) > MAX_METADATA_DEPTH:
        # Deeper values break JSON encoders downstream (the servers, exports).
        raise InvalidInputError(f"metadata is nested more than {MAX_METADATA_DEPTH} levels deep")
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded


def check_metadata_size(metadata: Mapping[str, Any], max_bytes: int) -> None:
    """A record's metadata, as JSON, within the store's size limit for a record's text:
    stored with it, it is read back with it (a server's answer, an agent's context)."""
    if metadata:
        size = len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if size > max_bytes:
            raise InvalidInputError(f"metadata is {size} bytes as JSON, over the {max_bytes}-byte limit")


def json_depth(value: Any, what: str = "metadata") -> int:
    """How deeply ``value`` nests, without recursion (it may be thousands deep), as its
    JSON will; a key that is not a string is refused, naming ``what``: json.dumps would
    turn 1, 1.5, True and None into "1", "1.5", "true" and "null", and {1: "a", "1": "b"}
    into one key. Walked once json.dumps took the value (or json.loads made it), so it
    is finite and acyclic."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            for key in item:
                if not isinstance(key, str):
                    raise InvalidInputError(f"{what} keys must be strings, not {_a(type(key))}")
            children: Iterable[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def loads_unique(raw: str | bytes, what: str, *, name_key: bool = True) -> Any:
    """JSON text parsed like ``json.loads``, but an object anywhere in it that repeats a
    key is refused, naming the key unless not ``name_key``: json.loads keeps the last
    value silently, and the writer meant one of them. So is an integer of more digits
    than Python converts (``sys.get_int_max_str_digits``). Malformed JSON raises what
    json.loads raises."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                named = f": {json.dumps(key)}" if name_key else ""
                raise InvalidInputError(f"{what} repeats a key in one object{named}")
            out[key] = value
        return out

    try:
        return json.loads(raw, object_pairs_hook=unique)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError:
        raise _too_many_digits(what) from None


def _too_many_digits(what: str) -> InvalidInputError:
    # What a ValueError of json's parser is when it is neither a JSONDecodeError nor a
    # UnicodeDecodeError: int()'s limit, which spares it a conversion that takes time
    # quadratic in the digits.
    return InvalidInputError(f"{what} holds an integer of more than {sys.get_int_max_str_digits()} digits")


def _past_space(text: str, at: int) -> int:
    """Where JSON's whitespace from ``at`` ends in ``text``."""
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def loads_envelope(raw: str | bytes, what: str, document: str) -> Any:
    """JSON text parsed as :func:`loads_unique` parses it, naming no key, but for the
    member ``document`` of its top-level object: where that holds an object (a signed
    document sent to be verified), the value is the exact text it has in ``raw``, for
    the verifier to read as :func:`loads_document` does. Parsed here, a key the document
    repeats would have lost a value, and the verifier would not see it to fail it.
    Raises what loads_unique raises."""
    # Bytes decoded as json.loads decodes them, so the body reads the same either way.
    text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
    at = _past_space(text, 0)
    if not text.startswith("{", at):
        return loads_unique(text, what, name_key=False)
    decoder = json.JSONDecoder()
    members: dict[str, Any] = {}
    at = _past_space(text, at + 1)
    more = not text.startswith("}", at)
    try:
        while more:
            if not text.startswith('"', at):
                raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, at)
            name, at = decoder.raw_decode(text, at)
            at = _past_space(text, at)
            if not text.startswith(":", at):
                raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
            start = _past_space(text, at + 1)
            value, at = decoder.raw_decode(text, start)
            if name in members:
                raise InvalidInputError(f"{what} repeats a key in one object")
            kept = name == document and isinstance(value, dict)
            members[name] = text[start:at] if kept else loads_unique(text[start:at], what, name_key=False)
            at = _past_space(text, at)
            more = text.startswith(",", at)
            if more:
                at = _past_space(text, at + 1)
            elif not text.startswith("}", at):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
    except json.JSONDecodeError:
        raise
    except ValueError:
        raise _too_many_digits(what) from None
    if _past_space(text, at + 1) != len(text):
        raise json.JSONDecodeError("Extra data", text, _past_space(text, at + 1))
    return members


def loads_document(raw: str | bytes, what: str) -> Any:
    """A signed document's JSON text (a certificate, a receipt, a rotation proof) as its
    checks must read it: refused (InvalidInputError) if an object repeats a key, for
    json.loads would check the last value where a reader that keeps the first, or a
    person, reads the other; or if it is not JSON. The message quotes nothing of the
    text: a forged document may carry personal data in its keys as in its values."""
    return _json_or_refused(lambda: loads_unique(raw, what, name_key=False), what)


def loads_readable(raw: str | bytes, what: str) -> Any:
    """JSON text parsed as json.loads parses it (where an object repeats a key, the last
    value), or InvalidInputError if it is not JSON at all. How the entry points of a
    verifier (the CLI, the servers) tell text that is no document, bad input like a
    truncated file, from a document the verifier reads strictly and fails at its first
    check, saying why (a repeated key, an unsigned member). Quotes nothing of the text."""
    return _json_or_refused(lambda: json.loads(raw), what)


def _json_or_refused(parse: Callable[[], Any], what: str) -> Any:
    try:
        return parse()
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{what} is not JSON: {_where(exc)}") from None
    except (ValueError, RecursionError):  # not UTF-8, an integer too long to convert, or nesting too deep
        raise InvalidInputError(f"{what} is not JSON deleatur can read") from None


def _where(exc: json.JSONDecodeError) -> str:
    # json's messages end in "at" ("Unterminated string starting at"), its position apart.
    return f"{exc.msg.removesuffix(' at')} at position {exc.pos}"


def utf8_text(data: bytes, what: str) -> str:
    """``data`` as text: JSON and every file deleatur reads are UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"{what} is not UTF-8 text") from None


def parse_metadata(raw: str) -> dict[str, Any]:
    try:
        value = loads_unique(raw, "metadata")
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"metadata is not valid JSON: {_where(exc)}") from None
    except RecursionError:
        # Deeper than the parser's stack, so far past what validate_metadata allows.
        raise InvalidInputError(f"metadata is nested more than {MAX_METADATA_DEPTH} levels deep") from None
    if not isinstance(value, dict):
        raise InvalidInputError("metadata must be a JSON object")
    return validate_metadata(value)


#: SQLite's largest integer: a count or an index beyond it cannot even be looked up.
MAX_INT = 2**63 - 1


def check_int(value: object, name: str, *, low: int) -> int:
    """An integer argument from ``low`` to :data:`MAX_INT`, else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_INT:
        raise InvalidInputError(f"{name} must be an integer from {low} to {MAX_INT}")
    return value


T = TypeVar("T")


def _a(kind: type) -> str:
    name = kind.__name__
    return {bool: "True or False", str: "a string"}.get(kind, f"{'an' if name[0] in 'aeiou' else 'a'} {name}")


def check_type(value: object, kind: type[T], name: str) -> T:
    """``value`` if it is a ``kind``, else an error naming the argument ``name``: a wrong
    type is the caller's mistake, to be told as one, never coerced (``dry_run=None`` would
    otherwise erase). A bool is never taken for an int, though Python makes it one."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InvalidInputError(f"{name} must be {_a(kind)}")
    if isinstance(value, str):
        _check_utf8(value, name)  # a lone surrogate reaches no hash, file or statement
    return value


def check_flags(**flags: object) -> None:
    """Each of ``flags`` True or False (see :func:`check_type`), named by its keyword."""
    for name, value in flags.items():
        check_type(value, bool, name)


def check_optional(value: object, kind: type[T], name: str) -> T | None:
    """:func:`check_type`, where None means the argument was not given."""
    return None if value is None else check_type(value, kind, name)


def check_items(value: object, kind: type[T], name: str) -> list[T]:
    """A collection of ``kind``: a list, tuple, set or generator, never a string or a
    mapping, which Python would iterate by character or by key."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidInputError(f"{name} must be a list, each item {_a(kind)}")
    items = list(value)
    for item in items:
        check_type(item, kind, f"each item of {name}")
    return items


#: The most hits one recall returns.
MAX_RECALL = 1000


def check_recall_limit(limit: object) -> int:
    value = check_type(limit, int, "limit")
    if not 1 <= value <= MAX_RECALL:
        raise InvalidInputError(f"limit must be between 1 and {MAX_RECALL}")
    return value


def check_number(value: object, name: str) -> float:
    """A finite int or float (never a bool); the caller checks its range."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise InvalidInputError(f"{name} is out of range")  # math.isfinite cannot take it
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a finite number")
    return value


#: Linux's limits on a file name and a path, in bytes (NAME_MAX, PATH_MAX).
_NAME_MAX, _PATH_MAX = 255, 4096


def check_path(value: object, name: str, *, written: bool = False) -> Path:
    """A file system path, given as a str or a path object alike, as ``open()`` takes one:
    one no file system can hold (a NUL byte, text that is not UTF-8) is refused here,
    naming the argument, not by the OS call that would raise ValueError or
    UnicodeEncodeError; so is a file to be ``written`` with too long a name."""
    if not isinstance(value, str | os.PathLike):
        raise InvalidInputError(f"{name} must be a path")
    path = Path(value)
    text = str(path)
    if "\0" in text:
        raise InvalidInputError(f"{name} contains a NUL byte")
    try:
        encoded = os.fsencode(text)
    except UnicodeEncodeError:
        raise InvalidInputError(f"{name} is not valid UTF-8") from None
    # A file to be written (``written``) is refused here rather than by the first stat()
    # of it: ENAMETOOLONG, which pathlib's exists() raises rather than answer False.
    too_long = len(encoded) >= _PATH_MAX or any(len(part) > _NAME_MAX for part in encoded.split(b"/"))
    if written and too_long:
        raise InvalidInputError(f"{name} is too long a path: a file name is at most {_NAME_MAX} bytes")
    return path


def validate_confidence(confidence: float | None) -> float | None:
    if confidence is None:
        return None
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise InvalidInputError("confidence must be a number")
    # An int compares with floats exactly, however large: math.isfinite cannot take one past a float's range.
    if (isinstance(confidence, float) and not math.isfinite(confidence)) or not 0.0 <= confidence <= 1.0:
        raise InvalidInputError("confidence must be between 0 and 1")
    return float(confidence)


@dataclass(frozen=True, slots=True)
class NewMemory:
    """One memory a caller wants written; validated on construction."""

    text: str
    subject: str
    key: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source: str | None = None
    confidence: float | None = None
    derived_from: tuple[str, ...] = ()
    expires_at: int | None = None

    def __post_init__(self) -> None:
        check_type(self.text, str, "text")  # its size is checked against the store's limit as it is written
        canonical_subject(self.subject)
        if self.key is not None:
            canonical_key(self.key)
        if self.source is not None:
            check_name(self.source, "source", allow_empty=False)
        object.__setattr__(self, "metadata", validate_metadata(self.metadata))
        object.__setattr__(self, "confidence", validate_confidence(self.confidence))
        object.__setattr__(self, "derived_from", tuple(check_items(self.derived_from, str, "derived_from")))
        if self.expires_at is not None and (
            isinstance(self.expires_at, bool)
            or not isinstance(self.expires_at, int)
            or not 0 <= self.expires_at <= LATEST
        ):
            raise InvalidInputError("expires_at must be microseconds since the epoch, from 1970 to the year 9999")


@dataclass(frozen=True, slots=True)
class Record:
    """A stored memory, decrypted."""

    id: str
    tenant: str
    space: Space
    subject: str
    subject_original: str
    key: str | None
    text: str
    metadata: Mapping[str, Any]
    source: str | None
    confidence: float | None
    derived_from: tuple[str, ...]
    status: Status
    supersedes: str | None
    created_at: int
    updated_at: int
    expires_at: int | None
    #: The salt of the record's commitment in the log. It stays inside the store: the
    #: JSON form leaves it out, so a record read back from JSON (a remote client's) has
    #: none (b""), and equality does not look at it.
    nonce: bytes = field(compare=False)
    reason: str | None = None
    actor: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The documented JSON shape of a record (the nonce is a salt, not data)."""
        return record_json(
            self.id,
            self.tenant,
            self.space,
            self.subject,
            self.subject_original,
            self.key,
            self.text,
            self.metadata,
            self.source,
            self.confidence,
            self.derived_from,
            self.status,
            self.supersedes,
            self.created_at,
            self.updated_at,
            self.expires_at,
            self.nonce,
            self.reason,
            self.actor,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        """The record :meth:`to_json` printed, but for its nonce (see ``nonce``)."""
        expires_at = data["expires_at"]
        return cls(
            id=data["id"],
            tenant=data["tenant"],
            space=Space(data["user_id"], data["agent_id"], data["run_id"]),
            subject=data["subject"],
            subject_original=data["subject_original"],
            key=data["key"],
            text=data["text"],
            metadata=dict(data["metadata"]),
            source=data["source"],
            confidence=data["confidence"],
            derived_from=tuple(data["derived_from"]),
            status=Status(data["status"]),
            supersedes=data["supersedes"],
            created_at=from_isoformat(data["created_at"]),
            updated_at=from_isoformat(data["updated_at"]),
            expires_at=None if expires_at is None else from_isoformat(expires_at),
            nonce=b"",
            reason=data["reason"],
            actor=data["actor"],
        )


# Positional, in Record's field order, as a Record is made from a stored row: keywords
# cost a third more, and a server makes one for every hit it answers with.
def record_json(  # noqa: PLR0917
    record_id: str,
    tenant: str,
    space: Space,
    subject: str,
    subject_original: str,
    key: str | None,
    text: str,
    metadata: Mapping[str, Any],
    source: str | None,
    confidence: float | None,
    derived_from: Iterable[str],
    status: Status,
    supersedes: str | None,
    created_at: int,
    updated_at: int,
    expires_at: int | None,
    _nonce: bytes,
    reason: str | None,
    actor: str | None,
) -> dict[str, Any]:
    """:meth:`Record.to_json` of a record of these fields, without the record: a server
    answers a recall with its hits' JSON straight from their stored rows. The nonce is
    left out (a salt, not data)."""
    created = isoformat(created_at)
    return {
        "id": record_id,
        "tenant": tenant,
        "user_id": space.user_id,
        "agent_id": space.agent_id,
        "run_id": space.run_id,
        "subject": subject,
        "subject_original": subject_original,
        "key": key,
        "text": text,
        "metadata": dict(metadata),
        "source": source,
        "confidence": confidence,
        "derived_from": list(derived_from),
        "status": status.value,
        "supersedes": supersedes,
        "reason": reason,
        "actor": actor,
        "created_at": created,
        # Most records were never updated: the time is spelt once (servers spell it for
        # every record they answer with).
        "updated_at": created if updated_at == created_at else isoformat(updated_at),
        "expires_at": None if expires_at is None else isoformat(expires_at),
    }


@dataclass(frozen=True, slots=True)
class Hit:
    """A recall result: a record and its BM25 score (higher is better)."""

    record: Record
    score: float

    def to_json(self) -> dict[str, Any]:
        """The record's JSON with its ``score``."""
        made = self.record.to_json()
        made["score"] = self.score
        return made

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Hit:
        return cls(Record.from_json(data), data["score"])


#: The space of a caller that names none: user "default", no agent, no run.
DEFAULT_SPACE = Space()


@dataclass(frozen=True, slots=True)
class SpaceFilter:
    """Which spaces an erasure reaches: a part left ``None`` matches any value."""

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None

    def __post_init__(self) -> None:
        if self.user_id is not None:
            _check_user_id(self.user_id)
        for name in ("agent_id", "run_id"):
            value = getattr(self, name)
            if value is not None:
                check_name(value, name, allow_empty=True)

    def matches(self, space: Space) -> bool:
        return (
            (self.user_id is None or self.user_id == space.user_id)
            and (self.agent_id is None or self.agent_id == space.agent_id)
            and (self.run_id is None or self.run_id == space.run_id)
        )

    @property
    def everywhere(self) -> bool:
        return self.user_id is None and self.agent_id is None and self.run_id is None

    def to_json(self) -> dict[str, str | None]:
        return {"user_id": self.user_id, "agent_id": self.agent_id, "run_id": self.run_id}


#: An erasure scope that reaches every space of the tenant.
EVERYWHERE = SpaceFilter()
