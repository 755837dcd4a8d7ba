"""Managing principals: authentication, creation, listing and revocation."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import AuthenticationError, InvalidInputError, NotFoundError, quoted
from ..model import check_items, check_name, check_tenant, check_type, erased_ref
from .calls import deny, refused_key, system_entry
from .principals import (
    Principal,
    Role,
    check_principal_name,
    digest_matches,
    new_api_key,
    parse_role,
    rescope,
    split_api_key,
)

if TYPE_CHECKING:
    from ..memory import Memory


def _principal(row: Mapping[str, Any]) -> Principal:
    fields = (
        str(row["id"]),
        str(row["tenant"]),
        str(row["name"]),
        str(row["role"]),
        row["scopes"],
        int(row["created_at"]),
        row["revoked_at"],
    )
    # Not a scoped one: its scopes are user ids, which an account erasure replaces in the
    # store, and a cache would keep.
    return _made_principal(fields) if fields[4] is None else _make_principal(fields)


_Fields = tuple[str, str, str, str, str | None, int, int | None]


def _make_principal(fields: _Fields) -> Principal:
    principal_id, tenant, name, role, scopes, created_at, revoked_at = fields
    return Principal(
        principal_id,
        tenant,
        name,
        Role(role),
        scopes=None if scopes is None else frozenset(json.loads(scopes)),
        created_at=created_at,
        revoked_at=revoked_at,
    )


# A server authenticates every request, and making the principal (its fields checked)
# was a third of that: a principal is immutable, so the one made from the same row
# serves again.
_made_principal = functools.lru_cache(maxsize=1024)(_make_principal)


def authenticate(memory: Memory, api_key: str) -> Principal:
    try:
        principal_id, secret = split_api_key(api_key)
    except AuthenticationError:
        refused_key(memory, None, None, "malformed")
        raise AuthenticationError("the API key is not valid") from None  # as for every refused key
    row = memory.backend.principal(principal_id)
    if row is None:
        problem = "unknown"
    elif row["revoked_at"] is not None:
        problem = "revoked"
    elif not digest_matches(bytes(row["key_digest"]), secret):
        problem = "secret"
    else:
        return _principal(row)
    refused_key(memory, principal_id, row, problem)
    raise AuthenticationError("the API key is not valid")


def create(
    memory: Memory, name: str, role: Role | str, scopes: Iterable[str] | None, tenant: str | None
) -> tuple[Principal, str]:
    target = memory.tenant if tenant is None else check_tenant(tenant)
    if target != memory.tenant and not memory.principal.operator:
        raise deny(memory, "only the deployment operator may create principals in another tenant", "operator")
    wanted = None if scopes is None else frozenset(check_items(scopes, str, "scopes"))
    for scope in wanted or ():
        check_name(scope, "each item of scopes", allow_empty=False)
    if wanted is not None and not wanted:
        raise InvalidInputError("scopes, when given, must name at least one user id")
    if wanted is not None and any(isinstance(s, str) and erased_ref(s) is not None for s in wanted):
        raise InvalidInputError("a scope may not be an erased user's marker (erased-user: and a reference)")
    principal_id = memory._ids.new().replace("-", "")
    principal = Principal(
        principal_id,
        target,
        # Checked as it comes in, not by Principal: a name stored before the rule must
        # still load, so that its principal can be listed and revoked.
        check_principal_name(name),
        role if isinstance(role, Role) else parse_role(role),
        scopes=wanted,
        created_at=memory._clock(),
    )
    api_key, digest = new_api_key(principal_id, memory._random(32))
    with memory._logged():
        memory.backend.put_principal(
            {
                "id": principal.id,
                "tenant": principal.tenant,
                "name": principal.name,
                "role": principal.role.value,
                "scopes": None if principal.scopes is None else json.dumps(sorted(principal.scopes)),
                "key_digest": digest,
                "created_at": principal.created_at,
                "revoked_at": None,
            }
        )
    return principal, api_key


def listing(memory: Memory) -> list[Principal]:
    return [_principal(row) for row in memory.backend.principals(memory.tenant)]


def revoke(memory: Memory, principal_id: str) -> None:
    check_type(principal_id, str, "principal_id")
    with memory._logged():
        if not memory.backend.revoke_principal(memory.tenant, principal_id, memory._clock()):
            raise NotFoundError(f"no active principal {quoted(principal_id)} in tenant {memory.tenant!r}")


def rescope_erased_accounts(memory: Memory, erased: list[tuple[str, list[str]]]) -> None:
    """Once, on opening a store an older release erased accounts in (see schema._v12):
    what :func:`~deleatur.access.principals.rescope_erased_user` does today, for the
    accounts it erased then. The rewrite commits with an entry per tenant it changed, as
    every other change to a principal is logged: the system's ``principal.rescope`` call,
    naming the principals changed and the erased users by token (never by id)."""
    by_tenant: dict[str, set[str]] = {}
    for tenant, users in erased:
        by_tenant.setdefault(tenant, set()).update(users)
    # audit_only: the rewrite goes ahead without the signing key, as a read's entry does
    # (its entry waits for the next checkpoint): a store whose key is being restored must
    # still open, and these scopes name erased users in clear until it is done.
    with memory._logged(audit_only=True) as events:
        for tenant, refs in sorted(by_tenant.items()):
            changed, replaced = rescope(memory, tenant, refs)
            if changed:
                extra = {"principals": sorted(changed), "upgrade": 12}  # the schema version that asked
                events.append((system_entry(memory, "principal.rescope", tenant, replaced, **extra), None))
        memory.backend.rescoped_erased()
