"""A store handle's turn: re-entrant, owned by the thread object, and known to be kept by
a thread that has ended."""

from __future__ import annotations

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


def test_the_main_thread_is_never_taken_for_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the interpreter runs its exit handlers the main thread reads as stopped,
    and may still hold the turn legitimately."""
    turn = Turn()
    stopped = threading.Thread(target=lambda: None)
    stopped.start()
    stopped.join()
    monkeypatch.setattr(threading, "main_thread", lambda: stopped)
    turn._owner, turn._depth = stopped, 1
    assert turn._lock.acquire(blocking=False)
    assert not turn.take_over()
    assert turn.acquire(timeout=0.01) is False  # waited, not told it was abandoned
