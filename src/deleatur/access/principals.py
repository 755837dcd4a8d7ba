"""Who calls: principals, their roles and capabilities, and their API keys.

A principal belongs to exactly one tenant and acts only inside it. Its role maps to
capabilities; its optional scopes name the ``user_id`` s it may touch. An API key
is ``dlt_<principal id>_<secret>``: the secret is 256 random bits, shown once, and
only its SHA-256 digest is stored (a secret that strong needs no slow hash).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import AuthenticationError, InvalidInputError, quoted
from ..model import ERASED_USER, Space, check_name, check_type, erased_ref, one_line

if TYPE_CHECKING:
    from ..memory import Memory

KEY_PREFIX = "dlt_"
SECRET_BYTES = 32
_KEY = re.compile(r"dlt_([0-9a-f]{32})_([A-Za-z0-9_-]{43})")
#: The id of the principal a local shell acts as: the deployment's operator.
OPERATOR_ID = "local-operator"


class Capability(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    DELETE = "delete"
    VERIFY = "verify"
    ADMIN = "admin"


class Role(enum.StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    AGENT = "agent"
    VIEWER = "viewer"
    AUDITOR = "auditor"


C = Capability
ROLE_CAPABILITIES: dict[Role, frozenset[Capability]] = {
    Role.ADMIN: frozenset(C),
    Role.MEMBER: frozenset({C.READ, C.WRITE, C.DELETE, C.VERIFY}),
    # Agents may erase, but only with the token of a dry run (see erasure.engine).
    Role.AGENT: frozenset({C.READ, C.WRITE, C.DELETE}),
    Role.VIEWER: frozenset({C.READ}),
    Role.AUDITOR: frozenset({C.VERIFY}),
}


@dataclass(frozen=True, slots=True)
class Principal:
    """A caller. ``scopes`` is None for a principal that may touch every user of its
    tenant; ``operator`` marks the deployment operator (a local shell), the only one
    who may purge audit entries."""

    id: str
    tenant: str
    name: str
    role: Role
    scopes: frozenset[str] | None = None
    operator: bool = False
    created_at: int = 0
    revoked_at: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant", Space(user_id=self.tenant).user_id)
        object.__setattr__(self, "role", Role(self.role))
        if self.scopes is not None:
            scopes = frozenset(u if erased_ref(u) else Space(user_id=u).user_id for u in self.scopes)
            object.__setattr__(self, "scopes", scopes)

    @classmethod
    def local_operator(cls, tenant: str) -> Principal:
        return cls(OPERATOR_ID, tenant, "local operator", Role.ADMIN, operator=True)

    @property
    def who(self) -> str:
        """The name as one line, as actors and requesters are kept: a principal named
        before names had to be one line may hold a line break, and must still act."""
        return one_line(self.name) or self.id

    @property
    def capabilities(self) -> frozenset[Capability]:
        return ROLE_CAPABILITIES[self.role]

    def covers(self, user_ids: Iterable[str], user_ref: Callable[[str], str]) -> bool:
        """Whether every one of ``user_ids`` is within this principal's scopes; ``user_ref``
        gives a user id's blind reference (hex), for the scopes whose user was erased."""
        scopes = self.scopes
        if scopes is None:
            return True
        erased = any(erased_ref(s) for s in scopes)
        return all(u in scopes or (erased and ERASED_USER + user_ref(u) in scopes) for u in user_ids)

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "role": self.role.value,
            "capabilities": sorted(c.value for c in self.capabilities),
            "scopes": None if self.scopes is None else sorted(self.scopes),
            "operator": self.operator,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }


def check_principal_name(name: object) -> str:
    """A new principal's name, trimmed: 1 to 200 characters and no control characters at
    all. The servers record it as the actor or requester of the principal's calls, where a
    control character would have every such call refused."""
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 200:
        raise InvalidInputError("a principal's name must be 1 to 200 characters")
    return check_name(name.strip(), "a principal's name", allow_empty=False)


def parse_role(value: str) -> Role:
    try:
        return Role(check_type(value, str, "role"))
    except ValueError:
        raise InvalidInputError(f"unknown role {quoted(value)}; roles are {', '.join(r.value for r in Role)}") from None


def new_api_key(principal_id: str, secret: bytes) -> tuple[str, bytes]:
    """The key string to show once, and the digest to store."""
    text = base64.urlsafe_b64encode(secret).rstrip(b"=").decode("ascii")
    return f"{KEY_PREFIX}{principal_id}_{text}", secret_digest(text)


def secret_digest(secret_text: str) -> bytes:
    return hashlib.sha256(b"deleatur/api-key/v1\n" + secret_text.encode("ascii")).digest()


def split_api_key(api_key: str) -> tuple[str, str]:
    """(principal id, secret text); a malformed key is refused without saying more."""
    match = _KEY.fullmatch(api_key.strip()) if isinstance(api_key, str) else None
    if match is None:
        raise AuthenticationError("the API key is malformed")
    return match.group(1), match.group(2)


def digest_matches(stored: bytes, secret_text: str) -> bool:
    return hmac.compare_digest(stored, secret_digest(secret_text))


def rescope_erased_user(memory: Memory, user_id: str) -> int:
    """An account erasure's: the principals scoped to the erased user keep that scope only
    by the user's blind reference, so no principal names the user any more, and each
    covers the same user ids as before. Inside the erasure's transaction (its call entry
    records the change); returns how many."""
    changed, _ = rescope(memory, memory.tenant, {memory._user_ref(user_id)})
    return len(changed)


def rescope(memory: Memory, tenant: str, refs: set[str]) -> tuple[list[str], set[str]]:
    """Replace, in the tenant's principals' scopes, each user id whose blind reference is
    one of ``refs`` by its marker. Returns the ids of the principals changed, and the
    references of the users whose scopes were replaced."""
    replaced: set[str] = set()

    def kept(scope: str) -> str:
        if erased_ref(scope) is not None:
            return scope
        ref = memory.keys.index.ref("user", tenant, scope).hex()
        if ref not in refs:
            return scope
        replaced.add(ref)
        return ERASED_USER + ref

    changed = []
    for row in memory.backend.principals(tenant):
        scopes = [] if row["scopes"] is None else json.loads(row["scopes"])
        rescoped = [kept(s) for s in scopes]
        if rescoped != scopes:
            memory.backend.set_principal_scopes(tenant, str(row["id"]), json.dumps(sorted(set(rescoped))))
            changed.append(str(row["id"]))
    return changed, replaced
