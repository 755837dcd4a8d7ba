"""Every public call of a :class:`~deleatur.Memory` is authorized, then audited.

``@guarded(action, capability, reach)`` wraps a method. Before the body runs, the
handle's principal must hold ``capability`` and its scopes must cover the users the
call reaches; a refusal raises :class:`~deleatur.errors.AccessDeniedError` and is
itself written to the log. Afterwards the call becomes one ``call`` entry (who,
tenant, which users as opaque tokens, action, outcome, request id): inside the
call's own write transaction when it has one, so the change and its audit commit
together, or in a transaction of its own for reads and failures.

The library never calls a guarded method from inside another (it calls the bodies),
so every guarded call is a caller's own: one made from a callback while another
call is in progress (an export's output stream, an iterable being read) is
authorized and audited like any other. Calls in progress are kept per thread.

Calls that only hand out public, content-free log material (checkpoints, proofs,
verification) are made with ``audit=False``: they are authorized, and a refusal is
logged, but a success is not. Logging them would change the very log they verify
with every look at it, so that no two readers would ever see the same checkpoint.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from ..model import DEFAULT_SPACE, EVERYWHERE, Space, SpaceFilter
from .principals import Capability

P = ParamSpec("P")
R = TypeVar("R")

#: Which user ids a call touches, from the handle it is made on and its arguments:
#: None for the whole tenant.
Reach = Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Iterable[str] | None]
#: What a call needs: one capability, or any of several.
Needed = Capability | tuple[Capability, ...]


def tenant_wide(_memory: object, _args: tuple[Any, ...], _kwargs: Mapping[str, Any]) -> None:
    return None


def no_user(_memory: object, _args: tuple[Any, ...], _kwargs: Mapping[str, Any]) -> tuple[()]:
    """Public material (the log's verifier keys): it reaches no user, so any key's scopes
    cover it, as any verifier may be handed it out of band."""
    return ()


def in_space(_memory: object, _args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str]:
    space = kwargs.get("space", DEFAULT_SPACE)
    return (space.user_id if isinstance(space, Space) else "",)


def of_user(_memory: object, _args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str] | None:
    user = kwargs.get("user_id")
    return None if user is None else (str(user),)


def of_filter(_memory: object, _args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str] | None:
    where = kwargs.get("where", kwargs.get("scope", EVERYWHERE))
    return (where.user_id,) if isinstance(where, SpaceFilter) and where.user_id is not None else None


def of_scopes(_memory: object, _args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str, ...] | None:
    """A new principal reaches the users it will be scoped to (all, if unscoped)."""
    scopes = kwargs.get("scopes")
    if not isinstance(scopes, list | tuple | set | frozenset) or not all(isinstance(s, str) for s in scopes):
        # None, or something the call itself refuses (or a generator, which reading here
        # would leave empty for the call): as reaching every user, which only an
        # unscoped admin may, and the call then judges the scopes.
        return None
    return tuple(scopes)


@dataclass(slots=True)
class Call:
    """One call in progress, and what its audit entry will say."""

    action: str
    request: str
    users: tuple[str, ...] | None
    subject: tuple[str, str] | None = None  # (pseudonym, sealed name) once the call names one
    outcome: str = "ok"
    error: str | None = None
    logged: bool = False
    audit: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    #: model.names_forgotten() as the call began.
    names_forgotten: int = 0
    #: How many scrubs the handle had tried as the call began (see Memory._leave_call).
    scrubs: int = 0


class Guarded(Protocol):
    def _enter_call(
        self, action: str, capability: Needed, users: Iterable[str] | None, request: Any, extra: dict[str, Any]
    ) -> Call: ...

    def _leave_call(self, call: Call, error: BaseException | None) -> None: ...

    @property
    def _current(self) -> Call | None: ...


G = TypeVar("G", bound=Guarded)


def guarded(
    action: str, capability: Needed, reach: Reach = tenant_wide, *, audit: bool = True
) -> Callable[[Callable[Concatenate[G, P], R]], Callable[Concatenate[G, P], R]]:
    def decorate(method: Callable[Concatenate[G, P], R]) -> Callable[Concatenate[G, P], R]:
        # Where a request id may come positionally (erasure_request("DSAR-1")), so that
        # the call's audit entry is named after it however it was passed.
        names = list(inspect.signature(method).parameters)[1:]
        at = names.index("request_id") if "request_id" in names else None

        @functools.wraps(method)
        def wrapper(self: G, /, *args: P.args, **kwargs: P.kwargs) -> R:
            request = args[at] if at is not None and at < len(args) else kwargs.get("request_id")
            # A dry run's entry says so, the refused one's too: it names the same action,
            # subject and request id as the erasure it plans.
            extra: dict[str, Any] = {"dry_run": True} if kwargs.get("dry_run") is True else {}
            call = self._enter_call(action, capability, reach(self, args, kwargs), request, extra)
            call.audit, call.logged = audit, not audit
            try:
                result = method(self, *args, **kwargs)
            except BaseException as exc:
                self._leave_call(call, exc)
                raise
            self._leave_call(call, None)
            return result

        return wrapper

    return decorate
