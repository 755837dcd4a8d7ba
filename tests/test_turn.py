"""A store handle's turn: re-entrant, owned by the thread object, and known to be kept by
a thread that has ended."""

from __future__ import annotations

import _thread
import linecache
import sys
import threading
from collections.abc import Callable
from functools import partial
from types import FrameType
from typing import Any

import pytest

from deleatur import turn as turn_module
from deleatur.turn import AbandonedTurn, Turn


def _in_a_thread(step: object) -> None:
    assert callable(step)
    thread = threading.Thread(target=step)
    thread.start()
    thread.join()


def test_the_turn_is_reentrant_and_only_its_holder_gives_it_back() -> None:
    turn = Turn()
    assert turn.acquire(timeout=1) and turn.acquire(timeout=1) and turn.try_acquire()
    outcome: list[object] = []
    _in_a_thread(lambda: outcome.extend([turn.try_acquire(), turn.acquire(timeout=0.01)]))
    assert outcome == [False, False]  # held here: the other thread waits, and times out
    with pytest.raises(RuntimeError, match="does not hold"):
        _raise_in_a_thread(turn.release)
    for _ in range(3):
        turn.release()
    _in_a_thread(lambda: outcome.append(turn.try_acquire()))
    assert outcome[-1] is True  # free once released as often as taken (and kept by that thread)


def _raise_in_a_thread(step: object) -> None:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            assert callable(step)
            step()
        except BaseException as exc:
            raised.append(exc)

    _in_a_thread(run)
    if raised:
        raise raised[0]


def test_a_turn_kept_by_a_thread_that_ended_is_said_and_can_be_taken_over() -> None:
    turn = Turn()
    assert not turn.take_over()  # nobody holds it
    _in_a_thread(lambda: turn.acquire(timeout=1))  # and ends, holding it
    with pytest.raises(AbandonedTurn):
        turn.acquire(timeout=30)  # at once, not after the timeout
    assert turn.take_over()
    assert not turn.take_over()  # this thread holds it now, and is alive
    outcome: list[object] = []
    _in_a_thread(lambda: outcome.append(turn.take_over()))
    assert outcome == [False]
    turn.release()  # once
    _in_a_thread(lambda: outcome.append(turn.try_acquire()))
    assert outcome[-1] is True


def test_a_thread_threading_did_not_start_is_known_to_have_ended_too() -> None:
    """Such a thread reads as alive for good to ``threading``, and a later one given its
    id gets the same ``Thread`` object: it must not share the turn an ended one kept."""
    turn = Turn()
    outcome: list[object] = []
    done = [threading.Event(), threading.Event()]

    def first() -> None:
        outcome.append(turn.acquire(timeout=1))  # and ends, holding it
        done[0].set()

    def second() -> None:
        try:
            outcome.append(turn.acquire(timeout=30))
        except AbandonedTurn as exc:
            outcome.append(exc)
        done[1].set()

    _thread.start_new_thread(first, ())
    assert done[0].wait(30)
    _thread.start_new_thread(second, ())
    assert done[1].wait(60)
    assert outcome[0] is True and isinstance(outcome[1], AbandonedTurn)


def _interrupted_at(line: int, step: Callable[[], object]) -> bool:
    """Run ``step`` with a KeyboardInterrupt raised as it reaches its ``line``-th line in
    deleatur/turn.py (as a Ctrl-C between two statements would); True if it was.

    Not on a ``with`` line: a line event also comes there as the block ends, before its
    ``__exit__`` is called, where a signal's exception is never raised (the interpreter
    raises it after a call or a backward jump): raising there would test the tracer."""
    seen = 0

    def trace(frame: FrameType, event: str, _arg: Any) -> Any:
        nonlocal seen
        if frame.f_code.co_filename != turn_module.__file__:
            return None
        if event == "line" and not linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip().startswith(
            "with "
        ):
            seen += 1
            if seen == line:
                raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        step()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


@pytest.mark.parametrize("held", [0, 1])
def test_an_interrupt_anywhere_in_taking_or_giving_back_the_turn_leaves_it_whole(held: int) -> None:
    """Wherever a KeyboardInterrupt lands in acquire or release, the turn is either this
    thread's, and given back by release, or free: never held with no holder, which no
    thread could give back. (An RLock-like lock taken before its holder was noted was.)"""
    for step_name in ("acquire", "try_acquire", "release"):
        line = 1
        while True:
            turn = Turn()
            for _ in range(held + (step_name == "release")):
                assert turn.acquire(timeout=1)
            steps: dict[str, Callable[[], object]] = {
                "acquire": partial(turn.acquire, timeout=1),
                "try_acquire": turn.try_acquire,
                "release": turn.release,
            }
            interrupted = _interrupted_at(line, steps[step_name])
            while True:  # give back what this thread holds, however much
                try:
                    turn.release()
                except RuntimeError:
                    break
            outcome: list[object] = []
            _in_a_thread(lambda: outcome.append(turn.try_acquire()))  # noqa: B023
            assert outcome == [True], (step_name, line)
            if not interrupted:
                break  # past the step's last line
            line += 1
