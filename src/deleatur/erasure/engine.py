"""Carrying out an erasure: one transaction for the records, index terms,
tombstones and request; then the subject's data key is destroyed.

The record store and the key store are two SQLite files, and SQLite commits a
WAL transaction across attached files atomically per file only. So the request
is committed as ``keys_pending`` with the keys to destroy, in the same
transaction that deletes the records; the keys are destroyed right after, and
a store opened later finishes any request left pending by a crash. Either
nothing is erased, or the records are gone and the keys follow.

The same protocol destroys the data keys that were made for a write whose records
never committed (:func:`collect_unused_keys`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..access.principals import OPERATOR_ID, Role, rescope_erased_user
from ..decisions.snapshots import pseudonymize_spaces, summary_key_ref
from ..decisions.snapshots import redact as redact_decisions
from ..errors import DeleaturError, InvalidInputError, KeyStoreBusyError, NotFoundError, StoreBusyError
from ..log.entries import Entry, EventType
from ..model import (
    ERASURES_MADE,
    SpaceFilter,
    canonical_subject,
    check_flags,
    check_optional,
    check_stated,
    check_who,
    forget_cached_names,
    one_line,
)
from ..store.protocol import WAL_NOT_TRUNCATED
from .plan import ErasurePlan, build_plan
from .requests import (
    SUBJECT_KEY_DESTROYED,
    ErasureRequest,
    RequestKind,
    RequestStatus,
    check_request_id,
    reached_users,
    space_pseudonym,
    within_scopes,
)

if TYPE_CHECKING:
    from ..memory import Memory

TOKEN_LIFETIME_US = 15 * 60 * 1_000_000
#: Asked for a token, the caller means to look first: never erase instead.
DRY_RUN_FIRST = "a confirmation token comes from a dry run: add dry_run"
NEEDS_BASIS = "an erasure needs a legal basis, e.g. 'Art. 17(1)(a)'"


class AmbiguousSubjectError(InvalidInputError):
    """The subject's canonical form covers several original spellings."""


class ConfirmationRequiredError(InvalidInputError):
    """An agent must present the single-use token its own dry run of this erasure returned;
    none, or one that does not confirm it (unknown, used, expired, another plan's)."""


class RequestIdReusedError(InvalidInputError):
    """A request id already names a different erasure."""


class _Repeated(Exception):
    """Leaves the write transaction (writing nothing) when the request id is already done."""


class _NothingDue(Exception):
    """Leaves the write transaction (writing nothing) when a purge finds nothing due."""

    def __init__(self, plan: ErasurePlan) -> None:
        self.plan = plan


@dataclass(frozen=True, slots=True)
class ErasureResult:
    request: ErasureRequest | None  # None for a dry run, and for a purge that found nothing due
    #: None when an earlier result is returned for a repeated id, and in a result read
    #: back from JSON (a remote client's): the JSON of an erasure that ran holds only its
    #: request, for the plan names what was erased (its subjects' spellings).
    plan: ErasurePlan | None
    token: str | None = None
    repeated: bool = False
    #: A purge that found no record due: it recorded no request (see README, "Retention").
    nothing_due: bool = False

    def to_json(self, now: int) -> dict[str, Any]:
        """A dry run's plan and token, a purge's plan that found nothing due, or the request
        an erasure made (or repeated): what every shell prints. ``now`` decides whether the
        request's deadline was met."""
        if self.request is None:
            assert self.plan is not None
            if self.nothing_due:
                return {"dry_run": False, "nothing_due": True, "plan": self.plan.to_json(), "request": None}
            return {"dry_run": True, "plan": self.plan.to_json(), "token": self.token}
        return {"request": self.request.to_json(now), "repeated": self.repeated}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ErasureResult:
        if data.get("dry_run") or data.get("nothing_due"):
            plan = ErasurePlan.from_json(data["plan"])
            return cls(None, plan, data.get("token"), nothing_due=bool(data.get("nothing_due")))
        return cls(ErasureRequest.from_json(data["request"]), None, repeated=data["repeated"])


def _as_shown(memory: Memory, result: ErasureResult) -> ErasureResult:
    """What the caller is told: a key scoped to users learns nothing of the records
    beyond its scopes (the stored request keeps every count, for the certificate)."""
    if memory.principal.scopes is None:
        return result
    plan = None if result.plan is None else result.plan.beyond_scopes_hidden()
    request = None if result.request is None else result.request.beyond_scopes_hidden()
    return replace(result, plan=plan, request=request)


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(b"deleatur/erasure-confirmation/v1\n" + token.encode()).digest()


def _confirmed_plan(memory: Memory, plan: ErasurePlan, principal_id: str) -> bytes:
    """What a token confirms: this plan, for this principal. Another principal holding
    the token (an agent handing it to another) cannot spend it. Keyed: the plan names the
    subject, and a plain hash of it, kept in the store, would confirm a guessed name."""
    return memory.keys.index.ref("confirmed-plan/v2", plan.digest, principal_id)


def _terms(memory: Memory, basis: str, requester: str) -> bytes:
    """The terms a token confirms beside its plan: the erasure's certificate states its
    basis, so a token shown one basis must not confirm another. Keyed, as the plan is: a
    requester may be a person's name."""
    return memory.keys.index.ref("confirmed-terms/v1", basis, requester)


def _confirmations_of(memory: Memory, plan: ErasurePlan) -> list[bytes]:
    """What a token of any principal of the tenant, the operator's included, confirms
    when issued for ``plan``."""
    ids = [OPERATOR_ID, *(str(row["id"]) for row in memory.backend.principals(memory.tenant))]
    return [_confirmed_plan(memory, plan, principal_id) for principal_id in ids]


def _check_token(memory: Memory, token_hash: bytes, confirmed: tuple[bytes, bytes] | None, request_id: str) -> None:
    """Spend the token (hashed) on the plan and terms it must confirm, or with None only check it
    (see use_confirmation); refuse the erasure if it cannot."""
    problem = memory.backend.use_confirmation(token_hash, memory.tenant, confirmed, memory._clock())
    if problem is not None:
        raise ConfirmationRequiredError(problem, request_id=request_id)


def _pseudonymizer() -> tuple[bytes, Callable[[str], str]]:
    """Names kept only as pseudonyms of one request, under a one-time key, and the key:
    discarded with the request, unless its certificate's absence check needs it (see
    :attr:`ErasureRequest.scope_key`)."""
    key = secrets.token_bytes(32)
    return key, functools.partial(space_pseudonym, key)


def _scope_pseudonyms(scope: SpaceFilter, pseudonym: Callable[[str], str]) -> SpaceFilter:
    """Keep the shape of the scope but not the ids."""
    return SpaceFilter(
        *(None if name is None else pseudonym(name) for name in (scope.user_id, scope.agent_id, scope.run_id))
    )


def get_request(memory: Memory, request_id: str) -> ErasureRequest:
    row = memory.backend.get_request(memory.tenant, check_request_id(request_id))
    if row is None:
        raise NotFoundError(f"no erasure request {request_id}", request_id=request_id)
    return ErasureRequest.from_row(row)


def finish_pending(memory: Memory, request: ErasureRequest) -> ErasureRequest:
    """Destroy the keys a committed erasure left pending (by key id: a key made for
    the subject since is spared), then mark the request complete."""
    if request.status is not RequestStatus.KEYS_PENDING:
        return request
    memory.keys.destroy_ids(request.pending_keys)
    # Counted from what was pending, not from what this call deleted: after a crash
    # between destruction and this update, the keys are already gone.
    counts = {**request.counts, "keys_destroyed": len(request.pending_keys)}
    done = replace(request, status=RequestStatus.COMPLETE, completed_at=memory._clock(), counts=counts, pending_keys=())
    with memory.backend.atomic():
        memory.backend.put_request(done.to_row(), replace=True)
        # The key store's -wal may hold the destroyed keys: marked anew after they went,
        # so no scrub that read the erasure's own mark before then clears it.
        memory.backend.scrub_after_commit()
    return done


def settle(memory: Memory, request: ErasureRequest) -> ErasureRequest:
    """Finish what a committed erasure left pending: destroy its keys, then truncate the
    -wal, so no page image of the erased rows stays in it (if another connection's read
    snapshot prevents that, the request says so). If the key store stays locked, the -wal
    is truncated all the same and the request stays ``keys_pending``: the next status
    read, repeat or open finishes it."""
    if request.status is RequestStatus.KEYS_PENDING:
        try:
            done = finish_pending(memory, request)
        except KeyStoreBusyError:
            done = request
    elif WAL_NOT_TRUNCATED in request.counts or memory.backend.scrub_pending():
        # A reader kept the -wal from being truncated, or the store is marked (its
        # process died, or a scrub is still waiting): try again, and say so if it fails,
        # rather than let a certificate take the request's silence for a clean -wal.
        done = request
    else:
        return request
    counts = {k: v for k, v in done.counts.items() if k != WAL_NOT_TRUNCATED}
    if not memory._scrub():
        counts[WAL_NOT_TRUNCATED] = 1
    if counts != done.counts:
        done = replace(done, counts=counts)
        with memory.backend.atomic():
            memory.backend.put_request(done.to_row(), replace=True)
    return done


def finish_all_pending(memory: Memory) -> None:
    """Settle every request left keys_pending, every tenant's, and destroy the unused keys
    a collection committed to destroy: on open, what a crash interrupted; after an
    erasure, what it found pending."""
    for row in memory.backend.pending_requests():
        settle(memory, ErasureRequest.from_row(row))
    collect_unused_keys(memory, ())


def pending_key_ids(memory: Memory) -> set[bytes]:
    """Every data key committed for destruction: a writer must not use one (Memory._live_keys)."""
    return {bytes.fromhex(key) for keys in memory.backend.pending_key_lists() for key in json.loads(keys)}


def _check_requester(requester: object, request_id: str, *, retry: bool) -> tuple[str, InvalidInputError | None]:
    """The requester as :func:`check_who` keeps it, and None. Releases before requesters had
    to be one line took ones of several lines, and the requests they left may be retried (a
    failed one) or repeated: a requester check_who refuses comes back in its one-line form,
    with the refusal, which :func:`erase` raises unless the request id names a request whose
    requester has that same one-line form. The id is looked up under the lock, as for every
    other check of it, not here: a caller without a token must learn nothing of the ids in use."""
    try:
        return check_who(requester, "requester", missing="an erasure needs a requester"), None
    except InvalidInputError as exc:
        exc.request_id = request_id
        refused = exc
    if retry and isinstance(requester, str):
        with contextlib.suppress(InvalidInputError):  # blank or too long as one line too
            return check_who(one_line(requester), "requester", missing=refused.message), refused
    raise refused


def _in_use(memory: Memory, tenant: str, subject_ref: bytes) -> bool:
    return subject_ref == summary_key_ref(memory, tenant) or memory.backend.holds_subject(tenant, subject_ref)


def collect_unused_keys(memory: Memory, candidates: Iterable[bytes] | None = None) -> int:
    """Destroy the data keys made for writes whose records never committed: a process
    killed between the key store's commit and the store's, or a write refused or failed
    under the lock. Such a key says that a subject was about to be written, of whom the
    store holds nothing. Returns how many it found unused (and destroyed).

    ``candidates``: the keys marked unconfirmed to look at (None: all of them). A key is
    in use, and its mark dropped, if a record or a restriction of its subject is stored,
    or if it is a tenant's key for decision summaries. An unused key may still be one a
    writer has read and is about to commit under: it is destroyed as an erasure destroys
    keys. Under the store's write lock, which no writer holds between checking its keys
    and committing, it is listed as pending, and committed; it is destroyed; then it is
    unlisted. A writer checks its keys under the lock against every pending key, and
    looks again for any key if another connection committed since it read them, so it
    writes under a new key instead (Memory._live_keys). A list that a crash left is
    finished first, by whichever collection runs next.
    """
    keys, backend = memory.keys, memory.backend
    wanted = None if candidates is None else list(candidates)
    marked = [] if wanted == [] else keys.unconfirmed(wanted)
    # A key's records and restriction go only with the key and its mark (an erasure): a
    # key seen in use stays in use, and its mark can go without the lock. A mark whose
    # key is gone (an older release destroyed it) goes too.
    unused = {k: (t, r) for k, t, r in marked if t is not None and r is not None and not _in_use(memory, t, r)}
    keys.unmark(k for k, _, _ in marked if k not in unused)
    listed = backend.collecting_keys()
    doomed: list[bytes] = []
    if unused or listed:
        with backend.atomic():
            pending, listed = pending_key_ids(memory), backend.collecting_keys()
            now_used = [k for k, (t, r) in unused.items() if _in_use(memory, t, r)]
            doomed = [k for k in unused if k not in pending and k not in now_used]
            if doomed:
                backend.set_collecting_keys([*listed, *doomed])
                # Destroyed without waiting for a reader of the key store, whose -wal may
                # then keep the keys: the mark has a later scrub (or open) truncate it.
                backend.scrub_after_commit()
        keys.unmark(now_used)
        if listed or doomed:
            destroy = {*listed, *doomed}
            keys.destroy_ids(destroy, wait=False)
            with backend.atomic():
                backend.set_collecting_keys([k for k in backend.collecting_keys() if k not in destroy])
                backend.scrub_after_commit()  # after the keys went: see finish_pending
    keys.unsettled.difference_update(wanted or ())
    return len(doomed)


def erase(
    memory: Memory,
    *,
    subject: str | None,
    scope: SpaceFilter,
    request_id: str,
    basis: str,
    requester: str,
    dry_run: bool = False,
    allow_ambiguous: bool = False,
    issue_token: bool = False,
    confirmation: str | None = None,
    require_confirmation: bool = False,
    retention: tuple[int, int | None] | None = None,
) -> ErasureResult:
    check_request_id(request_id)
    check_flags(
        dry_run=dry_run,
        allow_ambiguous=allow_ambiguous,
        issue_token=issue_token,
        require_confirmation=require_confirmation,
    )
    check_optional(confirmation, str, "confirmation")
    try:
        check_stated(basis, "basis", missing=NEEDS_BASIS)
    except InvalidInputError as exc:
        exc.request_id = request_id
        raise
    requester, refused = _check_requester(requester, request_id, retry=not dry_run)
    canonical = None if subject is None else canonical_subject(subject)
    if canonical is None and scope.user_id is None and retention is None:
        # A peer's delete_all with no filter wiped every user: never here.
        raise InvalidInputError("an account erasure needs a user id", request_id=request_id)

    if issue_token and not dry_run:
        raise InvalidInputError(DRY_RUN_FIRST, request_id=request_id)
    if dry_run and confirmation is not None:
        raise InvalidInputError(
            "a dry run takes no confirmation token: it changes nothing, and the token confirms the erasure after it",
            request_id=request_id,
        )
    if dry_run:
        plan = build_plan(memory, subject=canonical, scope=scope, retention=retention)
        token = None
        if issue_token:
            token = secrets.token_urlsafe(24)
            with memory.backend.atomic():
                now = memory._clock()
                # Each issue removes the tokens past their time: without it, every dry run
                # left its row (and its keyed hash of a subject's name) for good.
                removed = memory.backend.drop_confirmations(now)
                confirmed = _confirmed_plan(memory, plan, memory.principal.id)
                terms = _terms(memory, basis, requester)
                memory.backend.put_confirmation(
                    _token_hash(token), memory.tenant, confirmed, terms, now + TOKEN_LIFETIME_US
                )
            if removed:
                # Not waiting for a reader: the mark leaves the -wal to the next scrub or open.
                memory._scrub(wait=False)
        return _as_shown(memory, ErasureResult(None, plan, token))

    # Received when asked, not once the write lock is ours (up to the busy timeout later):
    # the deadline runs from receipt. So requests can commit out of this order, and the
    # list of requests follows the commit order instead (see put_request).
    received = memory._clock()
    if retention is not None:
        kind = RequestKind.RETENTION
    else:
        kind = RequestKind.SUBJECT if canonical is not None else RequestKind.ACCOUNT
    # A purge is the same request again if it asks for the same age limit: its absolute
    # times move with the clock, so a repeat would never match them.
    asked = None if retention is None else [None if retention[1] is None else retention[0] - retention[1]]
    fingerprint = memory.keys.index.ref(
        "erasure-request", kind.value, canonical or "", json.dumps([scope.to_json(), asked], sort_keys=True)
    )
    scope_key, space_pseudonym = _pseudonymizer()
    # What a failure records; a success fills in the rest.
    template = ErasureRequest(
        id=request_id,
        tenant=memory.tenant,
        kind=kind,
        subject_pseudonym=None,
        subject_ref=None,
        scope=_scope_pseudonyms(scope, space_pseudonym),
        basis=basis,
        requester=requester,
        received_at=received,
        completed_at=None,
        status=RequestStatus.FAILED,
        error=None,
        fingerprint=fingerprint,
        users=None if scope.user_id is None else tuple(reached_users(memory, [scope.user_id])),
    )
    # Refused before the request id is looked up, so a caller without a token learns
    # nothing of the ids in use; a refusal of confirmation records no request (the
    # audit log has the call), so it cannot hold an id another caller means to use.
    if confirmation is None and (require_confirmation or memory.principal.role is Role.AGENT):
        raise ConfirmationRequiredError(
            "this caller must confirm: run a dry run that issues a token (a dry run over MCP does; CLI"
            " --dry-run --issue-token; issue_token elsewhere), then present the token as confirmation (CLI"
            " --confirm TOKEN)",
            request_id=request_id,
        )
    token_hash = None if confirmation is None else _token_hash(confirmation)
    spent: tuple[bytes, bytes] | None = None  # what the token confirmed, once spent under the lock
    clash = None  # why the request id cannot name this erasure
    try:
        with memory._logged(sign=True) as events:
            if token_hash is not None:
                # As no token, so a string that is none (unknown to this tenant, or
                # expired) is refused before the id is looked up, recording nothing. A
                # spent token passes here, so that the erasure it confirmed can be
                # repeated (a retry of a lost answer), but confirms no other (below).
                _check_token(memory, token_hash, None, request_id)
            # Read under the write lock: two callers with one request id erase once.
            existing = memory.backend.get_request(memory.tenant, request_id)
            earlier = None if existing is None else ErasureRequest.from_row(existing)
            # A key scoped to users may not see a request beyond its scopes (calls.
            # readable_request): with a token, its id is answered as a free one would be
            # until the token has confirmed this very erasure, and is refused only then.
            hidden = (
                earlier is not None and memory.principal.scopes is not None and within_scopes(memory, earlier) is None
            )
            if refused is not None and (earlier is None or hidden or one_line(earlier.requester) != requester):
                raise refused
            if earlier is not None and (hidden or earlier.fingerprint != fingerprint):
                clash = f"request id {request_id} was used for a different erasure"
            elif earlier is not None and earlier.status is not RequestStatus.FAILED:
                if earlier.basis != basis:
                    # Its certificate states the first basis: a repeat must not seem to change it.
                    clash = f"request id {request_id} was made under another legal basis"
                else:
                    repeated = earlier
                    raise _Repeated
            if clash is not None and not (hidden and token_hash is not None):
                raise RequestIdReusedError(clash, request_id=request_id)
            if earlier is not None and clash is None:
                # A failed request retried is the same request: its one month runs from
                # its first receipt (Art. 12(3)), which its row keeps (see put_request).
                template = replace(template, received_at=earlier.received_at)
            plan = build_plan(memory, subject=canonical, scope=scope, retention=retention)
            # An agent principal hard-deletes only what its own dry run showed it. Spent
            # before any failure is recorded: a failure is recorded only for a caller who
            # confirmed (a later failure rolls the spending back, and the token can
            # confirm the retry). A token for another plan is refused and not spent.
            if token_hash is not None:
                confirming = (_confirmed_plan(memory, plan, memory.principal.id), _terms(memory, basis, requester))
                _check_token(memory, token_hash, confirming, request_id)
                spent = confirming
            if clash is not None:
                raise RequestIdReusedError(clash, request_id=request_id)
            if plan.ambiguous and not allow_ambiguous:
                raise AmbiguousSubjectError(
                    f"subject matches {len(plan.spellings)} different original spellings; "
                    "check the dry run, then pass allow_ambiguous (--allow-ambiguous)",
                    request_id=request_id,
                )
            subject_ref = None if canonical is None else memory._subject_ref(canonical)
            if kind is RequestKind.RETENTION and not plan.total and earlier is None:
                raise _NothingDue(plan)
            destroy = plan.destroy_keys
            pseudonym = None
            if subject_ref is not None and canonical is not None:
                pseudonym = memory.keys.pseudonym(memory.tenant, subject_ref, canonical)
            memory._purge(memory.backend.rows(memory.tenant, plan.ids))
            # Besides the rows, what follows rewrites others that named the subject or
            # account (decisions, restrictions, scopes): settle() scrubs, or the next open.
            memory.backend.scrub_after_commit()
            for ref in destroy:
                memory.backend.delete_restriction(memory.tenant, ref)  # its reason is the subject's data too
            # A key that another committed erasure is destroying is that one's to count
            # (this one finishes that erasure below).
            pending = pending_key_ids(memory)
            wanted = memory.keys.key_ids(memory.tenant, sorted(destroy))
            doomed_keys = [k for k in wanted if k not in pending]
            others_pending = len(doomed_keys) < len(wanted)
            now = memory._clock()
            memory.backend.drop_confirmations(now)
            if plan.total or plan.destroy_keys:
                # The other tokens of this plan (another principal's, or the caller's from
                # another dry run) can confirm nothing once what it names is gone, and each
                # holds a keyed hash of it, the subject's name included: spent, they keep
                # none, and still repeat this erasure until they expire.
                memory.backend.spend_confirmations(memory.tenant, _confirmations_of(memory, plan), now)
            redacted = redact_decisions(memory, plan.ids, request_id, now, events)
            moved = rescoped = 0
            if kind is RequestKind.ACCOUNT:
                moved = pseudonymize_spaces(memory, scope, space_pseudonym, events, request_id=request_id, now=now)
                if scope.user_id is not None and scope.agent_id is None and scope.run_id is None:
                    rescoped = rescope_erased_user(memory, scope.user_id)
                memory.backend.forget_scope_keys(memory.tenant, template.users or ())
            first = memory.backend.log_size() + len(events)
            fields = {"request": request_id, "basis": basis, "tenant": memory.tenant}
            events.extend((Entry(EventType.TOMBSTONE, now, {"record": rid, **fields}), None) for rid in plan.ids)
            assert plan.kept_elsewhere is not None and plan.outside_lineage is not None  # the store's own plan
            counts = {
                "records": plan.total,
                "direct": len(plan.direct),
                "lineage": len(plan.lineage),
                "keys_to_destroy": len(doomed_keys),
                "subjects": plan.subjects,
                "kept_in_other_spaces": plan.kept_elsewhere,
                "derived_outside_scope": plan.outside_lineage,
                "decisions_redacted": redacted,
            }
            if subject_ref is not None:
                # What this erasure did with the subject's key, for its certificate: the
                # key store can only say what holds now, after later erasures and writes.
                # Destroyed now, or gone already: never made, or destroyed before.
                gone = subject_ref in destroy or not memory.keys.has_key(memory.tenant, subject_ref)
                counts[SUBJECT_KEY_DESTROYED] = int(gone)
            if kind is RequestKind.ACCOUNT:
                counts["decisions_pseudonymized"] = moved
                counts["principals_rescoped"] = rescoped
            if kind is RequestKind.RETENTION:
                counts["kept_restricted"] = plan.kept_restricted
            # Its receipt and kind too, which the certificate states: the request's row can
            # be edited by anyone writing the store's files, what the log holds cannot. And
            # the ids of the data keys it destroys, so that `verify --store` finds one put
            # back by its id, which the key's wrapping binds, not by its editable creation
            # time. Ids name no one: random, and only in the key store and records rows.
            erasure = {
                **fields,
                "records": plan.total,
                "received": template.received_at,
                "kind": kind.value,
                "keys": sorted(key.hex() for key in doomed_keys),
            }
            events.append((Entry(EventType.ERASURE, now, erasure), None))
            request = replace(
                template,
                subject_pseudonym=pseudonym,
                subject_ref=subject_ref,
                status=RequestStatus.KEYS_PENDING,
                counts=counts,
                record_ids=tuple(plan.ids),
                tombstones=tuple(range(first, first + plan.total)),
                pending_keys=tuple(doomed_keys),
                # Only a request that ran: a failed one has no certificate to check.
                scope_key=scope_key if kind is RequestKind.SUBJECT and not scope.everywhere else None,
            )
            memory.backend.put_request(request.to_row(), replace=earlier is not None)
            made = int(memory.backend.get_setting(ERASURES_MADE) or 0)
            memory.backend.put_setting(ERASURES_MADE, str(made + 1))
    except _NothingDue as nothing:
        # A purge is the controller's own housekeeping, not a request anyone must be
        # answered: run daily, it would bury the requests under empty ones. The call's
        # audit entry shows it ran. (One that failed before is recorded, now done.)
        return _as_shown(memory, ErasureResult(None, nothing.plan, nothing_due=True))
    except _Repeated:
        return _as_shown(memory, ErasureResult(settle(memory, repeated), None, repeated=True))
    except RequestIdReusedError:
        if token_hash is not None and spent is not None:
            # Only a hidden request's id is refused once the token is spent (the rest
            # are refused before it is checked against the plan): the refusal keeps it
            # spent, as the erasure would have, so each id a scoped key finds in use
            # costs it a dry run, and it cannot probe on with one token.
            with memory.backend.atomic():
                memory.backend.use_confirmation(token_hash, memory.tenant, spent, memory._clock())
        raise
    except (ConfirmationRequiredError, StoreBusyError):
        # Busy: nothing was read under the lock, so the request row (perhaps a complete
        # erasure retried) must not be replaced by a failure, nor wait for the lock again.
        raise
    except DeleaturError as exc:
        # A refused requester records no request, here as above, nor does a request id
        # that names another erasure: the row is that one's.
        if exc is not refused and clash is None:
            with memory.backend.atomic():
                memory.backend.put_request(replace(template, error=exc.message).to_row(), replace=True)
            exc.request_recorded = True
        raise
    forget_cached_names()
    if others_pending:
        finish_all_pending(memory)
    return _as_shown(memory, ErasureResult(settle(memory, request), plan))
