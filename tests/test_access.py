"""Principals, capabilities and scopes: every operation against every kind of caller.

The table below is the specification: what each operation needs and whom it
reaches. The test runs each operation as each principal and checks that it goes
through exactly when the role holds a needed capability and the scopes cover the
users reached (a scoped key may reach the whole tenant only for verification),
and that every refusal names what is missing and is itself in the audit trail.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest

from deleatur import (
    AccessDeniedError,
    AuthenticationError,
    Capability,
    Entry,
    EventType,
    InvalidInputError,
    Memory,
    NotFoundError,
    Principal,
    Role,
    Space,
    SpaceFilter,
    StoreBusyError,
    StoreError,
    from_bytes,
)
from deleatur.access.calls import REFUSALS_PER_SECOND
from deleatur.access.principals import split_api_key
from deleatur.erasure.engine import ConfirmationRequiredError
from deleatur.erasure.verify import verify_certificate
from deleatur.log.receipt import verify_receipt
from deleatur.sqlitefile import first_try

from .conftest import MASTER, Cli, FakeClock, store_files

R, W, D, V, A = Capability.READ, Capability.WRITE, Capability.DELETE, Capability.VERIFY, Capability.ADMIN
U1, U2 = Space("u1"), Space("u2")
BASIS = "Art. 17(1)(a)"


@dataclass
class World:
    memory: Memory
    ids: dict[str, str]


Op = Callable[[Memory, World], Any]


@dataclass(frozen=True)
class Spec:
    name: str
    needs: tuple[Capability, ...]
    reach: str | None  # a user id, or None for the whole tenant
    run: Op


def _erase_all(m: Memory, w: World) -> Any:
    return m.erase_all(user_id="u1", request_id="ALL-1", basis=BASIS, requester="t")


OPS = [
    Spec("remember", (W,), "u1", lambda m, w: m.remember("x", subject="Carol", space=U1)),
    Spec("remember elsewhere", (W,), "u2", lambda m, w: m.remember("x", subject="Carol", space=U2)),
    Spec("get", (R,), "u1", lambda m, w: m.get(w.ids["u1"], space=U1)),
    Spec("recall", (R,), "u1", lambda m, w: m.recall("tea", space=U1)),
    Spec("recall_json", (R,), "u1", lambda m, w: m.recall_json("tea", space=U1)),
    Spec("list", (R,), "u1", lambda m, w: list(m.list(space=U1))),
    Spec("history", (R,), "u1", lambda m, w: m.history("alice::drink", space=U1)),
    Spec("versions", (R,), "u1", lambda m, w: list(m.versions("alice::drink", space=U1))),
    Spec("receipt", (R,), "u1", lambda m, w: m.receipt(w.ids["u1"], space=U1)),
    Spec("forget", (W,), "u1", lambda m, w: m.forget(key="alice::drink", space=U1)),
    Spec(
        "rectify",
        (W,),
        "u1",
        lambda m, w: m.rectify("alice::drink", "Alice likes coffee", reason="r", actor="t", space=U1),
    ),
    Spec(
        "rectify, erasing the old value",
        (W,),  # and delete as well: checked in the body, see EXTRA_NEEDS
        "u1",
        lambda m, w: m.rectify("alice::drink", "coffee", reason="r", actor="t", space=U1, erase_previous=True),
    ),
    Spec("erase", (D,), None, lambda m, w: m.erase("Alice", request_id="E-1", basis=BASIS, requester="t")),
    Spec(
        "erase in one user",
        (D,),
        "u1",
        lambda m, w: m.erase("Alice", request_id="E-2", basis=BASIS, requester="t", scope=SpaceFilter("u1")),
    ),
    Spec("erase_all", (D,), "u1", _erase_all),
    Spec("export a user", (R,), "u1", lambda m, w: m.export_json(io.StringIO(), user_id="u1")),
    Spec("export a subject", (R,), None, lambda m, w: m.export_json(io.StringIO(), subject="Alice")),
    Spec("restrict", (D,), None, lambda m, w: m.restrict("Alice", reason="dispute", actor="t")),
    Spec("unrestrict", (D,), None, lambda m, w: m.unrestrict("Bob", actor="t")),
    Spec("restrictions", (R,), None, lambda m, w: m.restrictions()),  # reasons are personal data
    Spec("purge", (D,), None, lambda m, w: m.purge()),
    Spec("set retention", (A,), None, lambda m, w: m.set_retention("run", 30)),
    Spec("retention policy", (R, V), None, lambda m, w: m.retention_policy()),
    Spec("erasure requests", (R, V), None, lambda m, w: m.erasure_requests()),
    Spec("erasure status", (R, V), None, lambda m, w: m.erasure_request("E-0")),
    Spec("certificate", (R, V), None, lambda m, w: m.certificate("E-0")),
    # An erasure in one user's records: a key scoped to that user follows it.
    Spec("erasure status in one user", (R, V), "u1", lambda m, w: m.erasure_request("E-U1")),
    Spec("certificate in one user", (R, V), "u1", lambda m, w: m.certificate("E-U1")),
    Spec("erasure status in another user", (R, V), "u2", lambda m, w: m.erasure_request("E-U2")),
    Spec("certificate in another user", (R, V), "u2", lambda m, w: m.certificate("E-U2")),
    Spec("checkpoint", (V, R, W), None, lambda m, w: m.checkpoint()),
    Spec("public key", (V, R, W), None, lambda m, w: m.public_key()),
    Spec("signing keys", (V, R, W), None, lambda m, w: m.signing_keys()),
    Spec("announced keys", (V, R, W), None, lambda m, w: m.announced_keys()),
    Spec("verify the log", (V,), None, lambda m, w: m.verify_log()),
    Spec("verify the audit trail", (V,), None, lambda m, w: m.verify_audit()),
    Spec("show the audit trail", (V,), None, lambda m, w: list(m.audit_entries())),
    Spec("create a principal", (A,), None, lambda m, w: m.create_principal("new", Role.VIEWER)),
    Spec("list principals", (A,), None, lambda m, w: m.principals()),
    Spec("record a decision", (W,), "u1", lambda m, w: m.record_decision("d", [w.ids["u1"]], space=U1)),
    Spec("explain a decision", (R,), "u1", lambda m, w: m.explain_decision(w.ids["decision"], space=U1)),
]
EXTRA_NEEDS = {"rectify, erasing the old value": D}
# A request's status names its requester, and its certificate the subject's pseudonym,
# which a dry run of a guessed name in a key's own scope would match: a scoped key reads
# only those in its scopes, verify or not.
STRICTLY_SCOPED = {
    "erasure status",
    "erasure status in one user",
    "erasure status in another user",
    "certificate",
    "certificate in one user",
    "certificate in another user",
}
# A scoped key lists its own: those within its scopes.
OWN_SCOPES = {"erasure requests"}
# The log's verifier keys reach no user: public material, which any key that may read,
# write or verify gets, scoped or not (an agent checks its erasures' certificates with it).
PUBLIC = {"public key", "signing keys", "announced keys"}

CALLERS = {
    "admin": (Role.ADMIN, None),
    "member": (Role.MEMBER, None),
    "agent": (Role.AGENT, None),
    "viewer": (Role.VIEWER, None),
    "auditor": (Role.AUDITOR, None),
    "member scoped to u1": (Role.MEMBER, ["u1"]),
    "member scoped to u2": (Role.MEMBER, ["u2"]),
    "auditor scoped to u2": (Role.AUDITOR, ["u2"]),
    "viewer scoped to u1": (Role.VIEWER, ["u1"]),
    "agent scoped to u1": (Role.AGENT, ["u1"]),
}


def _world(memory: Memory) -> World:
    ids = {
        "u1": memory.remember("Alice likes tea", subject="Alice", key="alice::drink", space=U1).id,
        "u2": memory.remember("Alice's tea in u2", subject="Alice", space=U2).id,
    }
    memory.remember("Bob's note", subject="Bob", space=U1)
    memory.restrict("Bob", reason="dispute", actor="t")
    memory.remember("to be erased", subject="Zed")
    memory.erase("Zed", request_id="E-0", basis=BASIS, requester="t")
    memory.remember("to be erased in u1", subject="Yan", space=U1)
    memory.erase("Yan", request_id="E-U1", basis=BASIS, requester="t", scope=SpaceFilter("u1"))
    memory.remember("to be erased in u2", subject="Yan", space=U2)
    memory.erase("Yan", request_id="E-U2", basis=BASIS, requester="t", scope=SpaceFilter("u2"))
    ids["decision"] = memory.record_decision("seed", [ids["u1"]], space=U1).id
    return World(memory, ids)


def _allowed(spec: Spec, role: Role, scopes: list[str] | None) -> bool:
    held = Principal("x" * 32, "default", "x", role).capabilities
    if not any(c in held for c in spec.needs):
        return False
    if spec.name in EXTRA_NEEDS and EXTRA_NEEDS[spec.name] not in held:
        return False
    if scopes is None or spec.name in OWN_SCOPES or spec.name in PUBLIC:
        return True
    if spec.name in STRICTLY_SCOPED:
        return spec.reach is not None and spec.reach in scopes
    # Beyond its scopes, a scoped key may only verify, and only if it holds verify.
    return (spec.reach is not None and spec.reach in scopes) or (V in spec.needs and V in held)


def _last_call(memory: Memory) -> Entry:
    raws = [raw for _, raw in memory.backend.log_entries()]
    return next(e for e in map(Entry.decode, reversed(raws)) if e.type is EventType.CALL)


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("spec", OPS, ids=[s.name for s in OPS])
def test_every_operation_checks_capability_and_scope(memory: Memory, spec: Spec, caller: str) -> None:
    role, scopes = CALLERS[caller]
    world = _world(memory)
    principal, _ = memory.create_principal(caller, role, scopes=scopes)
    view = memory.as_principal(principal)
    if not _allowed(spec, role, scopes):
        with pytest.raises(AccessDeniedError) as denied:
            spec.run(view, world)
        assert denied.value.missing in {c.value for c in (*spec.needs, *EXTRA_NEEDS.values())} | {"scope"}
        assert denied.value.exit_code == 3
        entry = _last_call(memory)
        assert entry.fields["outcome"] == "denied"
        assert entry.fields["actor"] == principal.id
        assert entry.fields["error"] == denied.value.missing
        assert entry.fields["request"] == denied.value.request_id
        return
    if role is Role.AGENT and spec.name == "rectify, erasing the old value":
        with pytest.raises(AccessDeniedError, match="an agent may not hard-delete") as refused:
            spec.run(view, world)
        assert refused.value.missing == "confirmation"
        assert len(memory.history("alice::drink", space=U1)) == 1  # nothing was erased
        return
    if role is Role.AGENT and (spec.name.startswith("erase") or spec.name == "purge"):
        # Allowed, but an agent must first see the blast radius in a dry run.
        with pytest.raises(ConfirmationRequiredError):
            spec.run(view, world)
        return
    spec.run(view, world)


def test_the_table_covers_every_guarded_method() -> None:
    guarded = {
        name for name in dir(Memory) if not name.startswith("_") and hasattr(getattr(Memory, name), "__wrapped__")
    }
    exercised = {
        "remember", "get", "recall", "recall_json", "list", "history", "versions", "receipt", "forget", "rectify",
        "erase", "erase_all", "export_json", "restrict", "unrestrict", "restrictions", "purge", "set_retention",
        "retention_policy",
        "erasure_requests", "erasure_request", "certificate", "checkpoint", "verify_log", "verify_audit",
        "audit_entries", "create_principal", "principals", "record_decision", "explain_decision",
        "public_key", "signing_keys", "announced_keys",
    }  # fmt: skip
    # Covered elsewhere: the same guard as a listed twin, key management (admin only), or
    # audit pruning (the operator only: test_audit.py).
    twins = {
        "remember_many", "export_csv", "revoke_principal", "residue", "prove", "consistency_request", "rotation_proof",
        "sign_pending",
        "add_cosignatures", "new_signing_key", "rotate_signing_key", "prune_audit",
    }  # fmt: skip
    assert guarded == exercised | twins


def test_another_tenant_sees_and_changes_nothing(memory: Memory) -> None:
    world = _world(memory)
    before = [r.id for r in memory.list(space=U1, include_history=True)]
    outsider, _ = memory.create_principal("acme admin", Role.ADMIN, tenant="acme")
    view = memory.as_principal(outsider)
    assert view.tenant == "acme"
    with pytest.raises(NotFoundError):
        view.get(world.ids["u1"], space=U1)
    assert view.recall("tea", space=U1) == []
    assert list(view.list(space=U1, include_history=True)) == []
    with pytest.raises(NotFoundError):
        view.history("alice::drink", space=U1)
    with pytest.raises(NotFoundError):
        view.forget(key="alice::drink", space=U1)
    with pytest.raises(NotFoundError):
        view.erasure_request("E-0")
    with pytest.raises(NotFoundError, match="not this tenant's"):
        view.prove(memory.backend.log_indexes_of(world.ids["u1"])[0])
    assert view.restrictions() == []
    assert view.principals() == [outsider]
    out = io.StringIO()
    assert view.export_json(out, subject="Alice")["records"] == 0
    assert view.erase("Alice", request_id="X-1", basis=BASIS, requester="t").request.counts["records"] == 0  # type: ignore[union-attr]
    assert [r.id for r in memory.list(space=U1, include_history=True)] == before
    assert memory.get(world.ids["u1"], space=U1).text == "Alice likes tea"
    # A tenant admin cannot reach into another tenant, nor mint keys there.
    tenant_admin, _ = memory.create_principal("default admin", Role.ADMIN)
    with pytest.raises(AccessDeniedError, match="operator") as denied:
        memory.as_principal(tenant_admin).create_principal("spy", Role.ADMIN, tenant="acme")
    assert denied.value.missing == "operator"


def test_a_scoped_key_proves_no_raw_log_entry_and_gets_receipts_of_its_records(memory: Memory) -> None:
    """A raw entry is what the audit trail shows a scoped key only in part: another
    user's calls, and the subject pseudonyms it could match to names it guesses."""
    mine = memory.remember("Alice likes tea", subject="Alice", space=U1)
    memory.remember("Bob likes coffee", subject="Bob", space=Space("u2"))
    for role in (Role.AUDITOR, Role.MEMBER):
        scoped, _ = memory.create_principal(f"u1 {role.value}", role, scopes=["u1"])
        view = memory.as_principal(scoped)
        for index in range(memory.backend.log_size()):
            with pytest.raises(AccessDeniedError, match="proves no raw log entry") as denied:
                view.prove(index)
            assert denied.value.missing == "scope"
        if role is Role.MEMBER:
            receipt = view.receipt(mine.id, space=U1)
            assert verify_receipt(receipt, memory.announced_keys(), pinned=True).ok
    assert memory.prove(0).index == 0  # a tenant-wide key proves any of its tenant's entries


def test_a_scoped_key_refused_beyond_its_scopes_is_told_to_name_one_of_its_users(memory: Memory) -> None:
    scoped, _ = memory.create_principal("u1 agent", Role.AGENT, scopes=["u1"])
    view = memory.as_principal(scoped)
    with pytest.raises(AccessDeniedError, match=r"outside this key's scopes \(give the user_id of one of them") as one:
        view.remember("x", subject="Carol")  # the default space: user "default"
    with pytest.raises(AccessDeniedError, match=r"beyond this key's scopes \(give the user_id of one of them"):
        view.erase("Carol", request_id="E-9", basis=BASIS, requester="t", dry_run=True)
    assert one.value.missing == "scope"
    assert view.remember("x", subject="Carol", space=U1).text == "x"


def test_only_the_operator_changes_the_signing_key_every_tenant_shares(memory: Memory) -> None:
    """One tenant's admin replacing the key that signs every tenant's checkpoints,
    receipts and certificates would break what the others' verifiers pinned."""
    before = memory.announced_keys()
    for tenant in ("default", "acme"):
        admin, _ = memory.create_principal(f"{tenant} admin", Role.ADMIN, tenant=tenant)
        view = memory.as_principal(admin)
        for change in (view.rotate_signing_key, view.new_signing_key):
            with pytest.raises(AccessDeniedError, match="is the deployment operator's alone") as denied:
                change()
            assert denied.value.missing == "operator"
    assert memory.announced_keys() == before
    denials = [a.entry.fields for a in memory.audit_entries(calls_only=True) if a.entry.fields["outcome"] == "denied"]
    assert [f["action"] for f in denials] == ["log.rotate_key", "log.new_key"]  # this tenant's two refusals
    memory.rotate_signing_key()  # the operator's own
    assert len(memory.announced_keys()) == len(before) + 1


def test_a_scoped_admin_grants_only_its_own_scopes(memory: Memory) -> None:
    scoped, _ = memory.create_principal("u1 admin", Role.ADMIN, scopes=["u1"])
    view = memory.as_principal(scoped)
    made, _ = view.create_principal("u1 viewer", Role.VIEWER, scopes=["u1"])
    assert made.scopes == frozenset({"u1"})
    for scopes in (None, ["u1", "u2"]):
        with pytest.raises(AccessDeniedError, match=r"(beyond|outside) this key's scopes") as denied:
            view.create_principal("too wide", Role.VIEWER, scopes=scopes)
        assert denied.value.missing == "scope"


@pytest.mark.parametrize("scope", ["\ud800", "u1\n", ""])
def test_a_scope_that_is_no_user_id_is_refused_naming_it_and_audited(memory: Memory, scope: str) -> None:
    """A scope is a user id: one with a lone surrogate (what Python makes of bytes that
    are not UTF-8), a control character or nothing is refused as bad input, and its
    refusal audited (the entry's token of a lone surrogate raised UnicodeEncodeError)."""
    with pytest.raises(InvalidInputError, match="each item of scopes"):
        memory.create_principal("bot", Role.VIEWER, scopes=[scope])
    assert _last_call(memory).fields["outcome"] == "failed"


def test_every_refused_api_key_is_audited_without_its_secret(memory: Memory, store_path: Path) -> None:
    principal, api_key = memory.create_principal("svc", Role.MEMBER)
    secret = split_api_key(api_key)[1]
    wrong = api_key[:-1] + ("A" if api_key[-1] != "A" else "B")
    unknown = "dlt_" + "0" * 32 + "_" + secret
    start = memory.backend.log_size()
    for bad in ("not a key", unknown, wrong):
        with pytest.raises(AuthenticationError, match=r"^the API key is not valid$"):  # whatever is wrong
            memory.authenticate(bad)
    memory.revoke_principal(principal.id)
    with pytest.raises(AuthenticationError, match=r"^the API key is not valid$"):
        memory.authenticate(api_key)
    seen = [
        (e.entry.fields["actor"], e.entry.fields["outcome"], e.entry.fields["error"])
        for e in memory.audit_entries(start=start, calls_only=True)
        if e.entry.fields["action"] == "authenticate"
    ]
    assert seen == [
        ("", "denied", "malformed"),
        ("0" * 32, "denied", "unknown"),
        (principal.id, "denied", "secret"),
        (principal.id, "denied", "revoked"),
    ]
    assert memory.verify_audit().ok
    memory.backend.scrub()
    for path in store_files(store_path):
        assert secret.encode() not in path.read_bytes(), path


def test_a_flood_of_refused_keys_is_counted_not_written(memory: Memory, clock: FakeClock) -> None:
    start = memory.backend.log_size()
    for _ in range(REFUSALS_PER_SECOND + 5):
        with pytest.raises(AuthenticationError):
            memory.authenticate("not a key")
    assert memory.backend.log_size() == start + REFUSALS_PER_SECOND  # the budget of one second
    clock.advance(1)
    with pytest.raises(AuthenticationError):
        memory.authenticate("dlt_" + "1" * 32 + "_" + "A" * 43)
    refused = [e.entry.fields for e in memory.audit_entries(start=start, calls_only=True)]
    refused = [f for f in refused if f["action"] == "authenticate"]
    assert len(refused) == REFUSALS_PER_SECOND + 1
    assert all("unwritten" not in f for f in refused[:-1])
    assert (refused[-1]["actor"], refused[-1]["unwritten"]) == ("1" * 32, 5)  # the five not written
    assert memory.verify_audit().ok


def test_a_refused_entry_put_off_by_a_busy_store_keeps_the_count_it_carried(
    memory: Memory, clock: FakeClock, store_path: Path
) -> None:
    """A server's first try of a call gives up on a lock held elsewhere and tries again
    later: the refusal entry it could not write must not lose the flood it counted."""
    from deleatur import StoreBusyError, sqlitefile

    start = memory.backend.log_size()
    for _ in range(REFUSALS_PER_SECOND + 4):
        with pytest.raises(AuthenticationError):
            memory.authenticate("not a key")
    clock.advance(1)
    holder = apsw.Connection(str(store_path))
    holder.execute("BEGIN IMMEDIATE").fetchall()
    with sqlitefile.first_try() as attempt, pytest.raises(StoreBusyError):
        memory.authenticate("still not a key")
    holder.execute("ROLLBACK").fetchall()
    holder.close()
    assert attempt.refused
    with pytest.raises(AuthenticationError):
        memory.authenticate("still not a key")  # the try again
    refused = [e.entry.fields for e in memory.audit_entries(start=start, calls_only=True)]
    refused = [f for f in refused if f["action"] == "authenticate"]
    assert len(refused) == REFUSALS_PER_SECOND + 1
    assert refused[-1]["unwritten"] == 4


def test_a_refused_entry_in_a_dropped_audit_batch_keeps_the_count_it_carried(memory: Memory, clock: FakeClock) -> None:
    """A server drops a group of entries it could not write (its calls are answered with
    the error): a refusal entry in it gives back the flood it counted, for the next."""
    start = memory.backend.log_size()
    for _ in range(REFUSALS_PER_SECOND + 4):
        with pytest.raises(AuthenticationError):
            memory.authenticate("not a key")
    clock.advance(1)
    batch = memory.audit_batch()
    with batch.collecting(), pytest.raises(AuthenticationError):
        memory.authenticate("still not a key")
    assert len(batch) == 1
    batch.drop()
    assert len(batch) == 0
    batch.write()  # nothing left to write
    with pytest.raises(AuthenticationError):
        memory.authenticate("still not a key")
    refused = [e.entry.fields for e in memory.audit_entries(start=start, calls_only=True)]
    refused = [f for f in refused if f["action"] == "authenticate"]
    assert len(refused) == REFUSALS_PER_SECOND + 1
    assert refused[-1]["unwritten"] == 4


def test_an_audit_batch_is_not_written_inside_a_read_snapshot(memory: Memory) -> None:
    """A read snapshot can write nothing: a batch written in one is refused with a clear
    error, keeps its entries, and is written once the snapshot ends."""
    record = memory.remember("kept", subject="a")
    start = memory.backend.log_size()
    batch = memory.audit_batch()
    with batch.collecting():
        memory.get(record.id)
    with memory.read_snapshot(), pytest.raises(StoreError, match="inside a read snapshot"):
        batch.write()
    assert len(batch) == 1 and memory.backend.log_size() == start
    batch.write()
    assert [e.entry.fields["action"] for e in memory.audit_entries(start=start, calls_only=True)] == [
        "get",
        "audit.show",
    ]


def test_a_write_inside_a_read_snapshot_is_refused_with_a_clear_error(memory: Memory) -> None:
    """It failed with apsw's "cannot start a transaction within a transaction"; so did a
    read snapshot begun inside another."""
    record = memory.remember("kept", subject="a")
    with memory.read_snapshot():
        for write in (
            lambda: memory.remember("new", subject="b"),
            lambda: memory.forget(record_id=record.id),
            lambda: memory.erase("a", request_id="R1", basis="Art. 17(1)(a)", requester="dpo"),
            memory.rotate_signing_key,
        ):
            with pytest.raises(StoreError, match="read snapshot is open on this store handle, and can write nothing"):
                write()
        with pytest.raises(StoreError, match="already open"), memory.read_snapshot():
            pass
        assert memory.get(record.id).text == "kept"
    assert [r.text for r in memory.list()] == ["kept"]
    assert memory.verify_log().ok


def test_api_keys_authenticate_and_only_their_digest_is_stored(memory: Memory, store_path: Path) -> None:
    principal, api_key = memory.create_principal("svc", Role.MEMBER, scopes=["u1"])
    assert memory.authenticate(api_key) == principal
    secret = split_api_key(api_key)[1]  # base64url secrets may contain "_" themselves
    memory.backend.scrub()
    for path in store_files(store_path):
        assert secret.encode() not in path.read_bytes(), path
    wrong = api_key[:-1] + ("A" if api_key[-1] != "A" else "B")
    unknown = "dlt_" + "0" * 32 + "_" + secret
    for bad in ("", "not a key", wrong, unknown, api_key + "x"):
        with pytest.raises(AuthenticationError) as refused:
            memory.authenticate(bad)
        assert refused.value.exit_code == 3
        assert secret not in refused.value.message
    memory.revoke_principal(principal.id)
    with pytest.raises(AuthenticationError):
        memory.authenticate(api_key)
    with pytest.raises(NotFoundError):
        memory.revoke_principal(principal.id)
    revoked = memory.principals()[0]
    assert revoked.revoked_at is not None
    with pytest.raises(AuthenticationError):
        memory.as_principal(revoked)


def test_bad_principal_input_is_refused_and_writes_nothing(memory: Memory) -> None:
    before = memory.principals()
    for name, role, scopes in (("", Role.VIEWER, None), ("x", "wizard", None), ("x", Role.VIEWER, [])):
        with pytest.raises(InvalidInputError, match=r"name|role|scopes"):
            memory.create_principal(name, role, scopes=scopes)
    assert memory.principals() == before


def test_principal_names_are_one_line_of_text(memory: Memory) -> None:
    """A name with a control character was accepted, and then every call that records
    the principal as actor or requester (a restriction; an erasure over a server) was
    refused, since notes refuse control characters."""
    before = memory.principals()
    for name in ("bell\x07bot", "tab\tbot", "two\nlines", "nul\x00", "del\x7f", "esc\x1b[31m", "bad \udcff"):
        with pytest.raises(
            InvalidInputError, match=r"^a principal's name (contains control characters|is not valid UTF-8)$"
        ):
            memory.create_principal(name, Role.MEMBER)
    with pytest.raises(InvalidInputError, match="1 to 200 characters"):
        memory.create_principal("x" * 201, Role.MEMBER)
    assert memory.principals() == before
    named, _ = memory.create_principal("  Support bot (EU)\n", Role.MEMBER)
    assert named.name == "Support bot (EU)"
    view = memory.as_principal(named)
    assert view.restrict("Alice", reason="contested", actor=view.principal.name).actor == "Support bot (EU)"


def test_principal_names_are_checked_by_the_cli(cli: Cli) -> None:
    assert cli("init")[0] == 0
    code, _, err = cli("principals", "create", "bell\x07bot", "--role", "agent")
    assert code == 2
    assert "a principal's name contains control characters" in err
    assert "bell" not in err


def test_agents_erase_with_the_token_of_their_dry_run(memory: Memory) -> None:
    memory.remember("Alice likes tea", subject="Alice")
    agent, _ = memory.create_principal("bot", Role.AGENT)
    view = memory.as_principal(agent)
    plan = view.erase("Alice", request_id="E-9", basis=BASIS, requester="bot", dry_run=True, issue_token=True)
    assert plan.token is not None
    done = view.erase("Alice", request_id="E-9", basis=BASIS, requester="bot", confirmation=plan.token)
    assert done.request is not None
    assert done.request.counts["records"] == 1


def test_every_call_is_audited_with_who_what_and_outcome(memory: Memory) -> None:
    viewer, _ = memory.create_principal("reader", Role.VIEWER, scopes=["u1"])
    view = memory.as_principal(viewer)
    record = memory.remember("Alice likes tea", subject="Alice Quartz", space=U1)
    view.get(record.id, space=U1)
    with pytest.raises(NotFoundError):
        view.get("01a22a03-19d9-75ea-b6f8-0a895b612b14", space=U1)
    calls = [
        e.fields for e in (Entry.decode(raw) for _, raw in memory.backend.log_entries()) if e.type is EventType.CALL
    ]
    *_, wrote, read, missed = calls
    assert (wrote["action"], wrote["actor"], wrote["outcome"]) == ("remember", "local-operator", "ok")
    assert (read["action"], read["actor"], read["role"], read["outcome"]) == ("get", viewer.id, "viewer", "ok")
    assert (missed["outcome"], missed["error"]) == ("failed", "NotFoundError")
    assert read["users"] == wrote["users"] and read["users"][0].startswith("u")
    assert "u1" not in read["users"]  # users appear as opaque tokens
    assert len({read["request"], missed["request"], wrote["request"]}) == 3


def test_calls_made_from_a_callback_during_a_call_are_checked_and_audited(memory: Memory) -> None:
    """An export's output stream is caller code that runs while the export is in
    progress: what it calls is a call of its own, authorized and audited."""
    mine = memory.remember("Alice likes tea", subject="Alice", space=U1)
    theirs = memory.remember("Bob's secret", subject="Bob", space=U2)
    viewer, _ = memory.create_principal("u1 viewer", Role.VIEWER, scopes=["u1"])
    view = memory.as_principal(viewer)
    refused: list[str] = []

    class Sneaky(io.StringIO):
        def write(self, text: str) -> int:
            for attempt in (
                lambda: view.get(theirs.id, space=U2),
                lambda: view.erase_all(user_id="u2", request_id="X-1", basis=BASIS, requester="t"),
            ):
                try:
                    attempt()
                except AccessDeniedError as exc:
                    refused.append(exc.missing)
            return super().write(text)

    view.export_json(Sneaky(), user_id="u1")
    assert refused and set(refused) == {"scope", "delete"}
    assert memory.get(theirs.id, space=U2).text == "Bob's secret"
    calls = [Entry.decode(raw).fields for _, raw in memory.backend.log_entries() if b'"type":"call"' in raw]
    denied = [c["action"] for c in calls if c["outcome"] == "denied"]
    assert set(denied) == {"get", "erase_all"} and len(denied) == len(refused)
    assert [c["action"] for c in calls if c["actor"] == viewer.id and c["outcome"] == "ok"] == ["export"]
    assert mine.id


def test_revocation_reaches_views_already_made_and_views_cannot_widen(memory: Memory) -> None:
    member, _ = memory.create_principal("member", Role.MEMBER, scopes=["u1"])
    view = memory.as_principal(member)
    view.remember("x", subject="a", space=U1)
    memory.revoke_principal(member.id)
    with pytest.raises(AccessDeniedError, match="revoked") as refused:
        view.remember("y", subject="a", space=U1)
    assert refused.value.missing == "principal"
    other, _ = memory.create_principal("other", Role.VIEWER, scopes=["u1"])
    wide = Principal(other.id, "default", "other", Role.ADMIN, operator=True)
    with pytest.raises(AccessDeniedError, match="only the handle that opened the store"):
        memory.as_principal(other).as_principal(wide)


def test_a_call_refused_inside_a_read_snapshot_is_audited_as_it_ends(memory: Memory, store_path: Path) -> None:
    """Calls in a read snapshot are authorized as of its start: a key another handle
    revoked before it began is refused there, and the refusal's entry, which the snapshot
    cannot write, is written as it ends (writing it in the snapshot failed: a busy error,
    after the whole busy timeout); a key revoked since it began still reads it."""
    before, _ = memory.create_principal("revoked before", Role.AUDITOR)
    since, _ = memory.create_principal("revoked since", Role.AUDITOR)
    start = memory.backend.log_size()
    with Memory.open(store_path, from_bytes(MASTER)) as verifier:
        refused, reading = verifier.as_principal(before), verifier.as_principal(since)
        memory.revoke_principal(before.id)
        with verifier.read_snapshot():
            memory.revoke_principal(since.id)
            with pytest.raises(AccessDeniedError, match="revoked") as denied:
                refused.verify_log()
            assert denied.value.missing == "principal"
            assert reading.verify_log().ok
    calls = [e.entry.fields for e in memory.audit_entries(start=start, calls_only=True)]
    assert [(c["actor"], c["action"], c["error"]) for c in calls if c["outcome"] == "denied"] == [
        (before.id, "log.verify", "principal")
    ]
    assert memory.verify_audit().ok


def test_an_audit_batch_writes_its_calls_entries_together_and_keeps_them_while_refused(
    memory: Memory, store_path: Path
) -> None:
    """Reads and refusals in a batch's block leave their entries in the batch, not the
    log; a write still commits its own entry at once. The batch writes them in call
    order, in one transaction; a write refused by a lock held elsewhere keeps them (and
    those collected meanwhile) for the next, and a batch written is empty."""
    record = memory.remember("batched", subject="a", space=U1)
    reader, _ = memory.create_principal("reader", Role.VIEWER, scopes=["u1"])
    view = memory.as_principal(reader)
    start = memory.backend.log_size()
    transactions: list[str] = []

    def traced(_cursor: apsw.Cursor, sql: str, _bindings: Any) -> bool:
        if sql.startswith("BEGIN"):
            transactions.append(sql)
        return True

    batch = memory.audit_batch()
    with batch.collecting():
        assert [h.record.id for h in view.recall("batched", space=U1)] == [record.id]
        assert view.get(record.id, space=U1).text == "batched"
        with pytest.raises(AccessDeniedError):
            view.list(space=U2)
        assert memory.backend.log_size() == start and len(batch) == 3
        memory.remember("written at once", subject="a", space=U1)
        assert memory.backend.log_size() == start + 2  # the record's entry and its call's
    holder = apsw.Connection(str(store_path))
    holder.execute("BEGIN IMMEDIATE").fetchall()
    try:
        with first_try(), pytest.raises(StoreBusyError):
            batch.write()
    finally:
        holder.execute("ROLLBACK").fetchall()
        holder.close()
    with batch.collecting():
        view.recall("batched", space=U1)
    assert memory.backend.log_size() == start + 2 and len(batch) == 4
    conn: apsw.Connection = memory.backend._conn  # type: ignore[attr-defined]
    conn.exec_trace = traced
    try:
        batch.write()
        batch.write()  # nothing left to write: no transaction
    finally:
        conn.exec_trace = None
    assert len(transactions) == 1 and len(batch) == 0
    calls = [e.entry.fields for e in memory.audit_entries(start=start, calls_only=True)]
    assert [(c["action"], c["outcome"]) for c in calls] == [
        ("remember", "ok"),
        ("recall", "ok"),
        ("get", "ok"),
        ("list", "denied"),
        ("recall", "ok"),
        ("audit.show", "ok"),  # this reading of the trail
    ]
    assert memory.verify_audit().ok


def test_a_scoped_key_cannot_derive_from_records_outside_its_scopes(memory: Memory) -> None:
    theirs = memory.remember("Bob's note", subject="Bob", space=U2)
    member, _ = memory.create_principal("u1 member", Role.MEMBER, scopes=["u1"])
    view = memory.as_principal(member)
    with pytest.raises(NotFoundError, match="unknown record id") as unknown:
        view.remember("derived", subject="Alice", space=U1, derived_from=[theirs.id])
    with pytest.raises(NotFoundError, match="unknown record id") as missing:
        view.remember("derived", subject="Alice", space=U1, derived_from=["01a22a03-19d9-75ea-b6f8-0a895b612b14"])
    assert str(unknown.value).replace(theirs.id, "ID") == str(missing.value).replace(missing.value.message[-36:], "ID")
    mine = view.remember("mine", subject="Alice", space=U1)
    assert view.remember("derived", subject="Alice", space=U1, derived_from=[mine.id]).derived_from == (mine.id,)


def test_agents_purge_only_with_the_token_of_their_dry_run(memory: Memory, clock: FakeClock) -> None:
    memory.remember("old", subject="a", expires_at=clock.now + 1)
    clock.advance(1)
    agent, _ = memory.create_principal("bot", Role.AGENT)
    view = memory.as_principal(agent)
    with pytest.raises(ConfirmationRequiredError) as refused:
        view.purge()
    assert refused.value.message == (  # what to do, in each interface's words
        "this caller must confirm: run a dry run that issues a token (a dry run over MCP does; CLI --dry-run"
        " --issue-token; issue_token elsewhere), then present the token as confirmation (CLI --confirm TOKEN)"
    )
    assert len(list(memory.list(include_history=True))) == 1
    plan = view.purge(dry_run=True, issue_token=True, request_id="RET-1")
    done = view.purge(confirmation=plan.token, request_id="RET-1")
    assert done.request is not None and done.request.counts["records"] == 1


def test_retention_policies_are_per_tenant(memory: Memory) -> None:
    outsider, _ = memory.create_principal("acme admin", Role.ADMIN, tenant="acme")
    memory.as_principal(outsider).set_retention("user", 1)
    assert memory.retention_policy()["user"] is None
    assert memory.remember("kept", subject="a").expires_at is None
    assert memory.as_principal(outsider).retention_policy()["user"] == 1


def test_reads_of_an_erasure_name_the_users_it_reached_whoever_reads(memory: Memory) -> None:
    """An unscoped key's read of one user's erasure names that user in its audit entry,
    as a scoped key's does, so the user's Art. 15 export finds it; a tenant-wide
    erasure names no one."""
    _world(memory)
    admin = memory.as_principal(memory.create_principal("dpo", Role.ADMIN)[0])
    for read, action in ((admin.erasure_request, "erasure.status"), (admin.certificate, "erasure.certificate")):
        read("E-U1")
        entry = _last_call(memory)
        assert (entry.fields["action"], entry.fields["request"]) == (action, "E-U1")
        assert entry.fields["users"] == [memory._user_token("u1")]
        read("E-0")
        assert "users" not in _last_call(memory).fields


def test_a_scoped_key_learns_nothing_of_a_subjects_records_beyond_its_scopes(memory: Memory) -> None:
    """Its dry run, its erasure's reply and the statuses it reads leave out the counts of
    records outside its scopes: a dry run would otherwise tell it whether, and how much,
    a person it names is known to other users. An unscoped key sees them."""
    memory.remember("Frank's file", subject="Frank", space=U2)
    memory.remember("Frank's note", subject="Frank", space=U1)
    principal, _ = memory.create_principal("member u1", Role.MEMBER, scopes=["u1"])
    view = memory.as_principal(principal)
    probe = view.erase("Frank", request_id="P-1", basis=BASIS, requester="t", scope=SpaceFilter("u1"), dry_run=True)
    assert probe.plan is not None and probe.plan.total == 1
    assert (probe.plan.kept_elsewhere, probe.plan.outside_lineage) == (None, None)
    assert probe.plan.to_json()["kept_in_other_spaces"] is None
    done = view.erase("Frank", request_id="E-F", basis=BASIS, requester="t", scope=SpaceFilter("u1"))
    assert done.request is not None and "kept_in_other_spaces" not in done.request.counts
    assert "kept_in_other_spaces" not in view.erasure_request("E-F").counts
    assert all("kept_in_other_spaces" not in r.counts for r in view.erasure_requests())
    certificate = view.certificate("E-F")["certificate"]
    assert "kept_in_other_spaces" not in certificate["request"]["counts"]
    assert "remain outside" not in certificate["scope_statement"]["text"]
    assert verify_certificate(view.certificate("E-F"), expected_key=memory.announced_keys()[-1]).ok
    assert memory.certificate("E-F")["certificate"]["request"]["counts"]["kept_in_other_spaces"] == 1
    assert memory.erasure_request("E-F").counts["kept_in_other_spaces"] == 1
    unscoped = memory.erase(
        "Frank", request_id="P-2", basis=BASIS, requester="t", scope=SpaceFilter("u1"), dry_run=True
    )
    assert unscoped.plan is not None and unscoped.plan.kept_elsewhere == 1


def test_a_scoped_key_follows_the_erasures_in_its_scopes(memory: Memory) -> None:
    _world(memory)
    principal, _ = memory.create_principal("member u1", Role.MEMBER, scopes=["u1"])
    view = memory.as_principal(principal)
    assert [r.id for r in view.erasure_requests()] == ["E-U1"]
    assert {r.id for r in memory.erasure_requests()} >= {"E-0", "E-U1", "E-U2"}
    assert view.erasure_request("E-U1").id == "E-U1"
    entry = _last_call(memory)
    assert (entry.fields["action"], entry.fields["outcome"]) == ("erasure.status", "ok")
    assert entry.fields["request"] == "E-U1"  # named after the request, though passed positionally
    assert entry.fields["users"] == [memory._user_token("u1")]
    # Another user's request, and one that does not exist, are refused alike.
    for other in ("E-U2", "E-0", "E-NONE"):
        with pytest.raises(AccessDeniedError) as denied:
            view.erasure_request(other)
        assert denied.value.missing == "scope"
        assert "E-" not in denied.value.message
    # Nor do the pages tell: a cursor beyond the key's scopes reads as one naming nothing.
    assert view.erasure_requests(after="E-U2") == view.erasure_requests(after="E-NONE") == []
    assert [r.id for r in memory.erasure_requests(after="E-0")][:1] != []  # the cursor works unscoped


def test_an_account_erasure_leaves_no_principal_naming_the_user(memory: Memory, store_path: Path) -> None:
    """A user id can name a person: the keys scoped to an erased account keep that scope
    only as the user's blind reference. They reach what they reached before (their own
    erasure's status and certificate, the same user id if it is used again), and their
    calls are audited under the same user token."""
    own, _ = memory.create_principal("app for Zebu", Role.MEMBER, scopes=["cust_zebu77"])
    both, _ = memory.create_principal("support", Role.MEMBER, scopes=["cust_zebu77", "u2"])
    other, _ = memory.create_principal("u2 only", Role.MEMBER, scopes=["u2"])
    view = memory.as_principal(own)
    view.remember("Zebu's parcel goes to Quokkafield", subject="Zebu", space=Space("cust_zebu77"))
    token = memory._user_token("cust_zebu77")
    result = view.erase_all(user_id="cust_zebu77", request_id="ACC-Z", basis=BASIS, requester="Zebu")
    assert result.request is not None and result.request.counts["principals_rescoped"] == 2
    scopes = {p.id: p.scopes for p in memory.principals()}
    assert scopes[other.id] == frozenset({"u2"})
    (marker,) = scopes[own.id] or ["missing"]
    assert marker.startswith("erased-user:") and scopes[both.id] == frozenset({marker, "u2"})
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(store_path))
    assert b"cust_zebu77" not in blob and b"Quokkafield" not in blob
    # The key as reloaded from the store still follows its erasure, audited as before.
    view = memory.as_principal(next(p for p in memory.principals() if p.id == own.id))
    assert view.erasure_request("ACC-Z").status.value == "complete"
    assert verify_certificate(view.certificate("ACC-Z"), expected_key=memory.announced_keys()[-1]).ok
    assert _last_call(memory).fields["users"] == [token]
    assert [r.id for r in view.erasure_requests()] == ["ACC-Z"]
    view.remember("a new account under the same id", subject="Zebu", space=Space("cust_zebu77"))
    assert _last_call(memory).fields["users"] == [token]
    with pytest.raises(AccessDeniedError):
        view.remember("another user's", subject="Oz", space=U2)
    # An erasure of one agent's spaces leaves the account, and its keys' scopes, as they are.
    memory.erase_all(user_id="u2", agent_id="a1", request_id="ACC-A", basis=BASIS, requester="dpo")
    assert {p.id: p.scopes for p in memory.principals()}[other.id] == frozenset({"u2"})


def test_a_scope_cannot_be_made_to_look_like_an_erased_user(memory: Memory) -> None:
    """Only an erasure makes a marker. A user id that merely starts like one (older
    releases took any) stays an ordinary user id: readable, scoped to, erased."""
    with pytest.raises(InvalidInputError, match="marker"):
        memory.create_principal("sneaky", Role.MEMBER, scopes=["erased-user:" + "0" * 32])
    assert [p.name for p in memory.principals() if p.name == "sneaky"] == []
    marker = "erased-user:" + memory._user_ref("alice")
    for make in (lambda: Space(marker), lambda: SpaceFilter(marker)):
        with pytest.raises(InvalidInputError, match="marker"):
            make()
    legacy = Space("erased-user:legacy")
    principal, _ = memory.create_principal("legacy app", Role.MEMBER, scopes=[legacy.user_id])
    view = memory.as_principal(principal)
    view.remember("a note", subject="Lee", space=legacy)
    assert _last_call(memory).fields["users"] == [memory._token("user", legacy.user_id)]
    assert [r.text for r in view.list(space=legacy)] == ["a note"]
    done = view.erase_all(user_id=legacy.user_id, request_id="ACC-L", basis=BASIS, requester="Lee")
    assert done.request is not None and done.request.counts["records"] == 1
    assert view.erasure_request("ACC-L").status.value == "complete"  # its key follows it, as any


def test_a_principal_named_before_names_were_one_line_still_acts_through_the_servers(memory: Memory) -> None:
    """The servers record a caller's principal name as the actor or requester, which
    must be one line; a name stored before that rule may hold a line break."""
    from deleatur.servers.calls import on_behalf

    principal, api_key = memory.create_principal("ops", Role.ADMIN)
    apsw.Connection(str(memory.backend.files()[0])).execute(
        "UPDATE principals SET name = ? WHERE id = ?", ("ops\n\x1bteam", principal.id)
    )
    view = memory.as_principal(memory.authenticate(api_key))
    assert view.principal.name == "ops\n\x1bteam" and view.principal.who == "ops team"
    memory.remember("Alice's note", subject="Alice")
    view.restrict("Alice", reason="contested", actor=on_behalf(view, None, "actor"))
    assert [r.actor for r in memory.restrictions()] == ["ops team"]
    erased = view.erase("Alice", request_id="E-LEGACY", basis=BASIS, requester=on_behalf(view, "Alice", "requester"))
    assert erased.request is not None and erased.request.requester == "Alice (via ops team)"


def test_a_scoped_verifier_is_refused_alike_a_certificate_beyond_its_scopes_and_none(memory: Memory) -> None:
    """Its own certificates it reads; another user's, and an id naming no request, are
    refused with the same error: no oracle of the ids in use, and no certificate whose
    subject pseudonym a dry run of a guessed name in its own scope would match."""
    _world(memory)
    view = memory.as_principal(memory.create_principal("member u1", Role.MEMBER, scopes=["u1"])[0])
    assert view.certificate("E-U1")["certificate"]["request"]["id"] == "E-U1"
    refusals = []
    for request_id in ("E-U2", "E-0", "NO-SUCH-REQUEST"):
        with pytest.raises(AccessDeniedError) as refused:
            view.certificate(request_id)
        refusals.append((refused.value.missing, refused.value.message.split(" may not ")[1]))
    assert len(set(refusals)) == 1, refusals


def test_only_unscoped_principals_are_kept_made_between_authentications(memory: Memory) -> None:
    """Authentication makes an unscoped principal once per row; a scoped one each time,
    since its scopes are user ids, which an account erasure replaces in the store and a
    cache in memory would keep."""
    _, unscoped_key = memory.create_principal("ops", Role.MEMBER)
    _, scoped_key = memory.create_principal("u7 bot", Role.VIEWER, scopes=["u7-person"])
    assert memory.authenticate(unscoped_key) is memory.authenticate(unscoped_key)
    scoped = memory.authenticate(scoped_key)
    again = memory.authenticate(scoped_key)
    assert scoped == again and scoped is not again
