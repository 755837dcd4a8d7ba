"""A store handle's turn: re-entrant, owned by the thread object, and known to be kept by
a thread that has ended."""

from __future__ import annotations

import _thread
import threading

import pytest

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
