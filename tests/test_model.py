from __future__ import annotations

import json
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deleatur import (
    DeleaturError,
    IntegrityError,
    InvalidInputError,
    Memory,
    NewMemory,
    Space,
    canonical_subject,
    from_bytes,
)
from deleatur.clock import LATEST, from_datetime, from_isoformat, isoformat, to_datetime
from deleatur.crypto.keystore import _frame
from deleatur.memory import _payload
from deleatur.model import (
    _has_controls,
    canonical_key,
    loads_envelope,
    parse_metadata,
    validate_metadata,
    validate_text,
)


def test_canonical_subject_folds_case_width_and_space() -> None:
    assert canonical_subject("  Alice   SMITH ") == "alice smith"
    assert canonical_subject("\uff21\uff2c\uff29\uff23\uff25") == "alice"  # fullwidth ALICE, NFKC
    assert canonical_subject("Straße") == "strasse"  # case folding, not lower()


@given(st.text(min_size=1, max_size=40))
def test_canonical_subject_is_idempotent(value: str) -> None:
    try:
        once = canonical_subject(value)
    except InvalidInputError:
        return
    assert canonical_subject(once) == once


@pytest.mark.parametrize("bad", ["", "   ", "a\x00b", "a\nb", "\udcff"])
def test_bad_subjects_are_refused(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="subject"):
        canonical_subject(bad)


@given(st.integers(min_value=from_datetime(datetime.min.replace(tzinfo=UTC)), max_value=LATEST))
def test_isoformat_is_the_aware_datetimes_spelling_and_reads_back(micros: int) -> None:
    assert isoformat(micros) == to_datetime(micros).isoformat().replace("+00:00", "Z")
    assert from_isoformat(isoformat(micros)) == micros


def test_isoformat_spells_whole_seconds_without_microseconds() -> None:
    assert isoformat(0) == "1970-01-01T00:00:00Z"
    assert isoformat(1) == "1970-01-01T00:00:00.000001Z"
    assert isoformat(LATEST) == "9999-12-31T23:59:59.999999Z"


def test_key_is_canonical_and_nonempty() -> None:
    assert canonical_key(" Alice::Phone ") == "alice::phone"
    with pytest.raises(InvalidInputError, match="key must not be empty"):
        canonical_key("  ")


def test_space_requires_a_user() -> None:
    with pytest.raises(InvalidInputError, match="user_id must not be empty"):
        Space("")
    assert Space() == Space("default", "", "")


def test_control_characters_are_exactly_those_of_unicode_category_cc() -> None:
    """Names, notes and texts refuse control characters by a character class, not by
    looking up each character's category: the two agree on every code point."""
    for code in range(0x110000):
        char = chr(code)
        assert _has_controls(f"a{char}b") == (unicodedata.category(char) == "Cc"), hex(code)
    for but in ("\t", "\t\n\r"):
        for code in range(0x100):
            char = chr(code)
            assert _has_controls(char, but=but) == (unicodedata.category(char) == "Cc" and char not in but)
    with pytest.raises(InvalidInputError, match="agent_id contains control characters"):
        Space("u", "agent\x85")
    with pytest.raises(InvalidInputError, match="control characters"):
        validate_text("bell \x07")
    assert validate_text("tab\tline\r\nbreak") == "tab\tline\r\nbreak"


def test_text_validation_names_the_problem() -> None:
    with pytest.raises(InvalidInputError, match="must not be empty"):
        validate_text(" \n ")
    with pytest.raises(InvalidInputError, match="over the 10-byte limit"):
        validate_text("x" * 11, max_bytes=10)
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        validate_text("bad \udcff byte")
    assert validate_text("é" * 5, max_bytes=10) == "é" * 5  # limit counts UTF-8 bytes


def test_metadata_must_be_a_json_object() -> None:
    assert parse_metadata('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        parse_metadata("{oops")
    with pytest.raises(InvalidInputError, match="JSON object"):
        parse_metadata("[1]")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        NewMemory(text="t", subject="s", metadata={"x": float("nan")})


@pytest.mark.parametrize("metadata", [{1: "a"}, {"a": [{"b": {None: 1}}]}, {"a": ({True: 1},)}, {1: "a", "1": "b"}])
def test_metadata_keys_that_are_not_strings_are_refused_not_turned_into_strings(metadata: dict[Any, Any]) -> None:
    with pytest.raises(InvalidInputError, match="metadata keys must be strings"):
        NewMemory(text="t", subject="s", metadata=metadata)
    assert NewMemory(text="t", subject="s", metadata={"a": ({"b": 1},)}).metadata == {"a": [{"b": 1}]}


def test_confidence_range() -> None:
    with pytest.raises(InvalidInputError, match="between 0 and 1"):
        NewMemory(text="t", subject="s", confidence=1.5)
    assert NewMemory(text="t", subject="s", confidence=1).confidence == 1.0


@pytest.mark.parametrize("depth", [33, 300, 100_000])
def test_metadata_nested_too_deep_is_refused(depth: int) -> None:
    nested: dict[str, object] = {}
    for _ in range(depth - 1):
        nested = {"k": nested}
    with pytest.raises(InvalidInputError, match="nested more than 32 levels"):
        validate_metadata(nested)


def test_metadata_nested_32_deep_is_kept() -> None:
    nested: dict[str, object] = {"leaf": [1, 2]}  # the list is the 32nd level
    for _ in range(30):
        nested = {"k": nested}
    assert validate_metadata(nested) == nested


_NOTED = {
    "rectify's reason": lambda m, v: m.rectify("k", "new", reason=v, actor="dpo"),
    "rectify's actor": lambda m, v: m.rectify("k", "new", reason="wrong", actor=v),
    "a restriction's reason": lambda m, v: m.restrict("Zed", reason=v, actor="dpo"),
    "a restriction's actor": lambda m, v: m.restrict("Zed", reason="contested", actor=v),
    "an erasure's basis": lambda m, v: m.erase("Zed", request_id="E-1", basis=v, requester="dpo"),
    "an erasure's requester": lambda m, v: m.erase("Zed", request_id="E-1", basis="Art. 17", requester=v),
    "a decision's summary": lambda m, v: m.record_decision(v, [m.list().__next__().id]),
}


@pytest.mark.parametrize("field", list(_NOTED))
@pytest.mark.parametrize(
    ("value", "problem"),
    [("bad \ud800", "not valid UTF-8"), ("bad \x00", "control characters"), ("x" * 70_000, "limit|longer than")],
    ids=["lone surrogate", "control character", "too long"],
)
def test_notes_beside_the_records_are_checked_before_anything_is_stored(
    memory: Memory, field: str, value: str, problem: str
) -> None:
    """Stored as given, a lone surrogate made the decision, its subject's export and the
    MCP server fail on every later read; a reason had no length limit at all."""
    memory.remember("old value", subject="Zed", key="k")
    before = [r.to_json() for r in memory.list(include_history=True)]
    with pytest.raises(InvalidInputError, match=problem):
        _NOTED[field](memory, value)
    assert [r.to_json() for r in memory.list(include_history=True)] == before
    assert memory.restrictions() == [] and memory.erasure_requests() == []
    assert memory.backend._conn.execute("SELECT count(*) FROM decisions").fetchall() == [(0,)]  # type: ignore[attr-defined]


def test_notes_keep_line_breaks_and_tabs_and_name_long_principals(memory: Memory) -> None:
    """A reason typed on Windows ends its lines in CRLF; a server names the caller's
    principal, whose name may hold a tab, in the actor and requester."""
    memory.remember("old value", subject="Zed", key="k")
    fixed = memory.rectify("k", "new", reason="line one\r\nline two\tend", actor="ops\tteam (via " + "p" * 300 + ")")
    assert fixed.text == "new"
    memory.restrict("Zed", reason="contested\r\n", actor="ops\tteam")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["doc", "key", "d"]), _JSON), st.sampled_from([None, 0, 2]))
def test_an_envelope_reads_as_json_but_keeps_its_documents_text(members: dict[str, Any], indent: int | None) -> None:
    """A verify route's body reads as json.loads reads it, but for its document, left as
    the text it has in the body when it is an object; and its bytes as json.loads's."""
    text = json.dumps(members, indent=indent)
    read = loads_envelope(text, "the body", "doc")
    assert loads_envelope(text.encode("utf-16"), "the body", "doc") == read
    if isinstance(members.get("doc"), dict):
        assert isinstance(read["doc"], str) and read["doc"] in text
        read["doc"] = json.loads(read["doc"])
    assert read == json.loads(text)


def test_an_envelope_keeps_a_key_its_document_repeats_and_refuses_the_rest() -> None:
    document = '{"basis": "Art. 6", "basis": "Art. 17"}'
    spaced = f' {{ "doc" :\n{document} , "key": null}} '
    assert loads_envelope(spaced, "the body", "doc") == {"doc": document, "key": None}
    for repeated in ('{"doc": {}, "doc": {}}', '{"doc": "{}", "key": {"Erin": 1, "Erin": 2}}', '[{"a": 1, "a": 2}]'):
        with pytest.raises(InvalidInputError, match=r"^the body repeats a key in one object$"):
            loads_envelope(repeated, "the body", "doc")
    for broken in ("", "{", '{"doc": {}', '{"doc": {},}', '{"doc" {}}', '{"doc": {}} {}', '{"doc": {"a": 1, "a": 2}'):
        with pytest.raises(json.JSONDecodeError):
            json.loads(broken)
        with pytest.raises(json.JSONDecodeError):
            loads_envelope(broken, "the body", "doc")
    with pytest.raises(InvalidInputError, match="holds an integer of more than"):
        loads_envelope('{"doc": {"n": ' + "7" * 5000 + "}}", "the body", "doc")


@given(st.dictionaries(st.text(max_size=5), _JSON))
def test_a_record_payload_reads_as_json_loads_reads_it(payload: dict[str, Any]) -> None:
    """A record's decrypted payload, as the store writes it (compact UTF-8, lone
    surrogates passed through), decodes as json.loads decodes it."""
    written = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert _payload(written) == json.loads(written.decode("utf-8", "surrogatepass"))


def test_a_record_payload_that_is_not_one_json_object_is_an_integrity_error() -> None:
    for broken in (b"", b"{", b'{"a":1} ', b'{"a":1}{}', b"[1]", b'"text"', b" {}"):
        with pytest.raises(IntegrityError, match="not the JSON object this store writes"):
            _payload(broken)


def test_a_records_associated_data_frames_its_id_and_subject(tmp_path: Path) -> None:
    """The record's AEAD associated data is the store's prefix, then its id and subject
    reference framed as _frame frames them (the inlined framing cannot drift)."""
    with Memory.open(tmp_path / "m.db", from_bytes(bytes(32)), create=True) as memory:
        prefix = _frame(("deleatur/record/v1", memory.backend.store_id, memory.tenant))

        @given(st.text(max_size=40), st.binary(max_size=40))
        def framed(record_id: str, subject_ref: bytes) -> None:
            assert memory._aad(record_id, subject_ref) == prefix + _frame((record_id, subject_ref))

        framed()


def test_an_error_quotes_at_most_64_characters_of_the_callers_value(memory: Memory) -> None:
    """An error message goes back to the caller, and into logs, whole: a 10,000-character
    id was quoted in full (twice over MCP, in the text and the structured content)."""
    long_id = "x" * 10_000
    for refused in (
        lambda: memory.get(long_id),
        lambda: memory.remember("a", subject="a", expires_at=long_id),
        lambda: memory.explain_decision(long_id),
    ):
        with pytest.raises(DeleaturError) as caught:
            refused()
        assert "'" + "x" * 62 + "…" in caught.value.message and len(caught.value.message) < 200
    with pytest.raises(DeleaturError, match="'abc' is not a record id"):
        memory.get("abc")  # a short value, whole
