"""What the guard does around each call: the authorization decision, the stack of
calls in progress (per thread), and the call's audit entry.

:class:`~deleatur.Memory` keeps only thin ``_enter_call``/``_leave_call`` methods
for :func:`~deleatur.access.guard.guarded`; the logic is here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..erasure.engine import get_request, settle
from ..erasure.requests import ErasureRequest, check_request_id, is_request_id, within_scopes
from ..errors import AccessDeniedError, DeleaturError, InvalidInputError, StoreBusyError
from ..log.entries import Entry, EventType
from ..model import canonical_subject
from .guard import Call, Needed
from .principals import Capability, Principal

if TYPE_CHECKING:
    from ..memory import Memory


def current(memory: Memory) -> Call | None:
    stack: list[Call] | None = getattr(memory._calls, "stack", None)
    return stack[-1] if stack else None


def deny(memory: Memory, message: str, missing: str) -> AccessDeniedError:
    """A refusal from inside a call's body (the guard's own refusals are in :func:`enter`)."""
    call = current(memory)
    return AccessDeniedError(message, missing=missing, request_id=None if call is None else call.request)


#: What a key scoped to some users is told when a call reaches beyond them: a call names
#: user "default" unless told otherwise, which is seldom one of the key's users.
_NAME_ONE = "give the user_id of one of them: whoami lists them"


def enter(
    memory: Memory,
    action: str,
    capability: Needed,
    users: Iterable[str] | None,
    request: Any,
    *,
    extra: dict[str, Any],
) -> Call:
    memory._refresh()
    # A caller's request id names the call only if it is a well-formed one.
    call = Call(action, request if is_request_id(request) else memory._ids.new(), None, extra=extra)
    principal = memory.principal
    wanted = capability if isinstance(capability, tuple) else (capability,)
    if not principal.operator and _revoked(memory, principal):
        problem, missing = "was revoked", "principal"
    elif not any(c in principal.capabilities for c in wanted):
        problem, missing = f"needs the {' or '.join(c.value for c in wanted)} capability", wanted[0].value
    elif users is None:
        # Verification material, which a verifier may use, is the only thing a
        # scoped key may read across the whole tenant.
        problem, missing = None, ""
        verifying = Capability.VERIFY in wanted and Capability.VERIFY in principal.capabilities
        if principal.scopes is not None and not verifying:
            problem, missing = f"reaches every user of the tenant, beyond this key's scopes ({_NAME_ONE})", "scope"
    else:
        call.users = tuple(users)
        problem, missing = None, ""
        if not principal.covers(call.users, memory._user_ref):
            problem, missing = f"reaches a user outside this key's scopes ({_NAME_ONE})", "scope"
    if problem is not None:
        call.outcome, call.error = "denied", missing
        append(memory, call)
        raise AccessDeniedError(
            f"{principal.role.value} principal {principal.id} may not {action}: it {problem}",
            missing=missing,
            request_id=call.request,
        )
    memory._calls.__dict__.setdefault("stack", []).append(call)
    return call


def of_request(memory: Memory, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str, ...] | None:
    """An erasure request's status and certificate reach the users its erasure reached,
    so a key scoped to them can follow its own erasures. A request that reaches anyone
    else, or none that exists, reaches a user no scope covers: a scoped key is refused
    alike either way, so it cannot probe which requests exist beyond its scopes, and,
    verifier or not, reads no certificate of theirs (whose subject pseudonym a dry run
    of a guessed name in its own scope would match)."""
    request_id = args[0] if args else kwargs.get("request_id")
    if memory.principal.scopes is None or not is_request_id(request_id):
        return None
    row = memory.backend.get_request(memory.tenant, request_id)
    reached = None if row is None else within_scopes(memory, ErasureRequest.from_row(row))
    return (_BEYOND_SCOPES,) if reached is None else reached


#: The user a request beyond a scoped key's scopes reaches, as far as that key can tell:
#: no user id has a control character, so no scope covers it.
_BEYOND_SCOPES = "\x00beyond the key's scopes"


def name_request_users(memory: Memory, request: ErasureRequest) -> None:
    """Name the users ``request`` reached in the current call's audit entry, as the
    guard names a call's users, so that each of them finds the reads of their erasure
    (Art. 15) whoever made them. A scoped key's call names them already."""
    call = current(memory)
    if call is not None and call.users is None and request.users is not None:
        call.extra["users"] = sorted({memory.keys.index.token("user", bytes.fromhex(ref)) for ref in request.users})


def readable_request(memory: Memory, request_id: str) -> ErasureRequest:
    """A request's status, for the caller. A scoped key reads only those within its
    scopes, even if it may verify: unlike a certificate, a status is not content-free
    (it names the requester, and an error). Beyond them, missing or not, it is refused
    alike."""
    if memory.principal.scopes is None:
        request = settle(memory, get_request(memory, request_id))
    else:
        row = memory.backend.get_request(memory.tenant, check_request_id(request_id))
        found = None if row is None else ErasureRequest.from_row(row)
        if found is None or within_scopes(memory, found) is None:
            raise deny(memory, "this key reads only the erasure requests within its scopes", "scope")
        request = settle(memory, found).beyond_scopes_hidden()
    name_request_users(memory, request)
    return request


def readable_requests(memory: Memory, *, limit: int | None, after: str | None) -> list[ErasureRequest]:
    """The tenant's requests, or a scoped key's own (those within its scopes): up to
    ``limit`` of them, in the order recorded, from after the request ``after``."""
    scoped = memory.principal.scopes is not None
    out: list[ErasureRequest] = []
    if scoped and after is not None:
        # A cursor outside the key's scopes reads as one that names no request: the
        # pages must not tell which other users' request ids exist.
        row = memory.backend.get_request(memory.tenant, after)
        if row is None or within_scopes(memory, ErasureRequest.from_row(row)) is None:
            return out
    while True:
        # A scoped key's page is filtered: read on until it is full or the requests end.
        batch = None if limit is None else max(limit - len(out), 100) if scoped else limit - len(out)
        rows = memory.backend.requests(memory.tenant, after=after, limit=batch)
        for row in rows:
            request = ErasureRequest.from_row(row)
            if scoped and within_scopes(memory, request) is None:
                continue
            out.append(request.beyond_scopes_hidden() if scoped else request)
            if limit is not None and len(out) == limit:
                return out
        if batch is None or len(rows) < batch:
            return out
        after = str(rows[-1]["id"])


def own_scopes(memory: Memory, _args: tuple[Any, ...], _kwargs: Mapping[str, Any]) -> tuple[str, ...] | None:
    """A call that a scoped key makes over its own users only."""
    scopes = memory.principal.scopes
    return None if scopes is None else tuple(scopes)


def _revoked(memory: Memory, principal: Principal) -> bool:
    """Revocation takes effect on the next call, on every view already made."""
    row = memory.backend.principal(principal.id)
    return row is None or row["revoked_at"] is not None


def leave(memory: Memory, call: Call, error: BaseException | None) -> None:
    popped = memory._calls.stack.pop()
    assert popped is call
    if error is None and call.logged:
        return
    if error is not None:
        if not call.audit and not isinstance(error, AccessDeniedError):
            return
        if isinstance(error, StoreBusyError):
            return  # nothing was done, and its entry would wait out the lock a second time
        call.outcome = "denied" if isinstance(error, AccessDeniedError) else "failed"
        call.error = error.missing if isinstance(error, AccessDeniedError) else type(error).__name__
        if isinstance(error, DeleaturError) and error.request_id is None:
            error.request_id = call.request
    append(memory, call)


def append(memory: Memory, call: Call) -> None:
    """The call's entry in a transaction of its own (a read, a refusal, a failure)."""
    memory._audit(entry(memory, call))


#: Refused API keys audited per second by one open store; the rest are counted.
REFUSALS_PER_SECOND = 10


@dataclass
class RefusalBudget:
    """Anyone can present a bad key, and each audited refusal takes the write lock and
    stays in the log for good: a flood of them must fill neither. Past the budget a
    refusal is counted, and the next one written says how many were not."""

    second: int = -1
    written: int = 0
    unwritten: int = 0

    def admit(self, now: int) -> int | None:
        """None: only count this refusal. Else: write it, with how many went unwritten."""
        if now // 1_000_000 != self.second:
            self.second, self.written = now // 1_000_000, 0
        if self.written >= REFUSALS_PER_SECOND:
            self.unwritten += 1
            return None
        self.written += 1
        unwritten, self.unwritten = self.unwritten, 0
        return unwritten

    def unadmit(self, now: int, unwritten: int) -> None:
        """The entry :meth:`admit` let through was not written (the store was busy): as if
        it had not been admitted, so the count it carried is not lost."""
        if now // 1_000_000 == self.second:
            self.written -= 1
        self.unwritten += unwritten


def refused_key(memory: Memory, principal_id: str | None, row: Mapping[str, Any] | None, problem: str) -> None:
    """Audit a refused API key (its caller is told only that the key is not valid):
    under the principal id it names, if it is well-formed, and never with its secret.
    ``problem`` is malformed, unknown, revoked or secret (a wrong one)."""
    now = memory._clock()
    unwritten = memory._refusals.admit(now)
    if unwritten is None:
        return
    fields: dict[str, Any] = {"action": "authenticate", "actor": principal_id or ""}
    if row is not None:
        fields |= {"role": str(row["role"]), "tenant": str(row["tenant"])}
    else:
        fields |= {"role": "", "tenant": memory.tenant}
    fields |= {"outcome": "denied", "request": memory._ids.new(), "error": problem}
    if unwritten:
        fields["unwritten"] = unwritten  # refusals since the last entry, over the budget
    refusal = Entry(EventType.CALL, now, fields)
    try:
        memory._audit(refusal)
    except StoreBusyError:
        refusal_unwritten(memory, refusal)
        raise


def refusal_unwritten(memory: Memory, entry: Entry) -> None:
    """``entry``, one that calls made, will not be written after all: if it is a refused
    key's (:func:`refused_key`), as if it had not been admitted, so the count it carried
    is not lost."""
    if entry.type is EventType.CALL and entry.fields.get("action") == "authenticate":
        memory._refusals.unadmit(entry.time, int(entry.fields.get("unwritten", 0)))


def entry(memory: Memory, call: Call) -> Entry:
    principal = memory.principal
    # Users as opaque per-tenant tokens: a user id can name a person.
    users = None if call.users is None else {memory._user_token(u) for u in call.users}
    return _entry(memory, call, actor=principal.id, role=principal.role.value, tenant=memory.tenant, users=users)


#: The actor, and role, of a change the store makes by itself, which no principal asked
#: for and no person made: an upgrade's, as the store is opened.
SYSTEM = "system"


def system_entry(memory: Memory, action: str, tenant: str, user_refs: Iterable[str], **extra: Any) -> Entry:
    """The entry of a change the store made by itself in ``tenant``: a ``call`` entry, as
    every other change to principals leaves, whose actor and role are :data:`SYSTEM`. It
    names the users reached by the tokens every other entry names them by (``user_refs``
    are their blind references, hex, as erasure requests keep them), never by id."""
    users = {memory.keys.index.token("user", bytes.fromhex(ref)) for ref in user_refs}
    call = Call(action, memory._ids.new(), None, extra=extra)
    return _entry(memory, call, actor=SYSTEM, role=SYSTEM, tenant=tenant, users=users)


def _entry(memory: Memory, call: Call, *, actor: str, role: str, tenant: str, users: set[str] | None) -> Entry:
    fields: dict[str, Any] = {
        "action": call.action,
        "actor": actor,
        "role": role,
        "tenant": tenant,
        "outcome": call.outcome,
        "request": call.request,
    }
    if users is not None:
        fields["users"] = sorted(users)
    if call.subject is not None:
        fields["subject"], fields["sealed"] = call.subject
    if call.error is not None:
        fields["error"] = call.error
    return Entry(EventType.CALL, memory._clock(), {**fields, **call.extra})


def name_subject(memory: Memory, subject: str | None) -> None:
    """Name the subject of the current call in its audit entry: as a pseudonym that
    dies with the subject's key, and sealed under that key for `audit show`."""
    call = current(memory)
    if call is None or call.subject is not None or not isinstance(subject, str):
        return
    try:
        canonical = canonical_subject(subject)
    except InvalidInputError:
        return  # the call itself reports the bad subject
    subject_ref = memory._subject_ref(canonical)
    pseudonym = memory.keys.pseudonym(memory.tenant, subject_ref, canonical)
    sealed = memory.keys.seal(memory.tenant, subject_ref, canonical)
    if pseudonym is not None and sealed is not None:
        call.subject = (pseudonym, sealed)
