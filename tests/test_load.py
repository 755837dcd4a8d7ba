"""Concurrent clients on loopback, bounded in count and time, ending with an exact
count: every acknowledged write is there once, nothing lost, nothing duplicated,
while recalls and erasures of other subjects run alongside."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from deleatur import Role
from deleatur.servers.http import create_app

from .serving import api_key, new_store, serving

CLIENTS = 24
WRITES = 25
DEADLINE_S = 90


async def _load(url: str, key: str) -> tuple[list[str], list[str]]:
    limits = httpx.Limits(max_connections=CLIENTS + 2)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits, headers=headers) as http:

        async def writer(n: int) -> list[str]:
            ids = []
            for i in range(WRITES):
                body = {"text": f"load note w{n} i{i} tag{n}x{i}", "subject": f"customer {n % 5}", "user_id": "load"}
                response = await http.post("/v1/memories", json=body)
                assert response.status_code == 201, response.text
                ids.append(response.json()["id"])
                if i % 5 == 0:
                    recalled = await http.get("/v1/memories/search", params={"q": f"tag{n}x{i}", "user_id": "load"})
                    assert [h["id"] for h in recalled.json()["hits"]] == [ids[-1]]
            return ids

        async def eraser() -> list[str]:
            done = []
            for i in range(10):
                body = {"text": f"short-lived {i}", "subject": f"leaver {i}", "user_id": "load"}
                assert (await http.post("/v1/memories", json=body)).status_code == 201
                erased = await http.delete(f"/v1/subjects/leaver {i}", headers={"Idempotency-Key": f"LOAD-{i}"})
                assert erased.status_code == 202, erased.text
                assert erased.json()["counts"]["records"] == 1
                done.append(erased.json()["request_id"])
            return done

        results = await asyncio.gather(*(writer(n) for n in range(CLIENTS)), eraser())
        written = [record_id for ids in results[:-1] for record_id in ids]
        listed = await http.get("/v1/memories", params={"user_id": "load", "limit": 10_000})
        return written, [r["id"] for r in listed.json()["records"]]


@pytest.mark.parametrize("handles", [1, 4])
def test_concurrent_clients_lose_and_duplicate_nothing(tmp_path: Path, handles: int) -> None:
    opener = new_store(tmp_path / "mem.db")
    key = api_key(opener, Role.MEMBER)
    app = create_app(opener, handles=handles)
    started = time.monotonic()
    with serving(app) as url:
        written, listed = asyncio.run(asyncio.wait_for(_load(url, key), DEADLINE_S))
    assert len(written) == CLIENTS * WRITES
    assert len(set(written)) == len(written)
    assert Counter(listed) == Counter(written)  # exactly the acknowledged writes, each once
    assert 1 <= app.state.pool.size <= handles
    assert time.monotonic() - started < DEADLINE_S
