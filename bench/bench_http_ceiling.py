"""The HTTP stack's own ceiling (issue 6): requests/s that uvicorn serves on this
machine for routes shaped like ``remember`` and ``recall`` that do no library work
at all, under the load ``bench_http.py --wrk`` puts on the real server.

Three apps answer the same requests with a constant body of the real size (a
recall's ten hits, a remember's record):

- ``fastapi``: FastAPI as ``deleatur.servers.http`` uses it (a bearer-key dependency
  on every route, the same query parameters, a strict pydantic body for remember);
- ``starlette``: a bare Starlette route;
- ``asgi``: a raw ASGI callable, the least any Python server does per request.

Whatever the library costs comes on top of these, so a figure here below a target
means no implementation on this stack meets that target on this machine. Not a
test. From the repository root (wrk: ``apt-get install wrk``)::

    .venv/bin/python bench/bench_http_ceiling.py --workers 1 --json
    .venv/bin/python bench/bench_http_ceiling.py --workers 2 --json
"""

# The routes parse and validate their arguments, the cost being measured, and ignore them.
# ruff: noqa: ARG001

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bench_http import TARGETS, free_port, load_options, wait_ready, wrk
from bench_log import print_results
from bench_store import machine

_RECORD: dict[str, Any] = {
    "id": "019a0000-0000-7000-8000-000000000000",
    "tenant": "default",
    "user_id": "default",
    "agent_id": "",
    "run_id": "",
    "subject": "person 1",
    "key": None,
    "text": "bench note 1 w1",
    "metadata": {},
    "source": None,
    "confidence": None,
    "derived_from": [],
    "status": "ACTIVE",
    "supersedes": None,
    "created_at": "2026-11-30T18:00:00.000000Z",
    "updated_at": "2026-11-30T18:00:00.000000Z",
    "expires_at": None,
    "for_legal_claim": False,
}
RECALL = {"hits": [{**_RECORD, "score": 1.5} for _ in range(10)]}
REMEMBER = _RECORD


# -- fastapi --------------------------------------------------------------------------

_BEARER = HTTPBearer(auto_error=False)


async def _authenticated(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
    if credentials is None:
        raise ValueError("no key")


class RememberBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    subject: str
    user_id: str = "default"
    agent_id: str = ""
    run_id: str = ""
    key: str | None = None
    metadata: dict[str, Any] | None = None
    source: str | None = None
    confidence: float | None = None
    derived_from: list[str] = []
    expires_at: int | str | None = None
    for_legal_claim: bool = False


fastapi_app = FastAPI(dependencies=[Depends(_authenticated)])


@fastapi_app.post("/v1/memories", status_code=201)
async def remember(body: RememberBody) -> dict[str, Any]:
    return REMEMBER


@fastapi_app.get("/v1/memories/search")
async def recall(
    q: str,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
    user_id: str = "default",
    agent_id: str = "",
    run_id: str = "",
) -> dict[str, Any]:
    return RECALL


# -- starlette ------------------------------------------------------------------------


async def _remember(request: Request) -> JSONResponse:
    await request.json()
    return JSONResponse(REMEMBER, status_code=201)


async def _recall(request: Request) -> JSONResponse:
    return JSONResponse(RECALL)


starlette_app = Starlette(
    routes=[
        Route("/v1/memories", _remember, methods=["POST"]),
        Route("/v1/memories/search", _recall),
        Route("/openapi.json", _recall),  # what wait_ready asks for
    ]
)


# -- raw ASGI -------------------------------------------------------------------------

_BODIES = {"POST": (201, json.dumps(REMEMBER).encode()), "GET": (200, json.dumps(RECALL).encode())}


async def asgi_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    status, body = _BODIES[scope["method"]]
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- the benchmark --------------------------------------------------------------------


def run_round(app: str, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The loops deleatur's own server uses: asyncio for one worker, uvloop for several.
    loop = "asyncio" if args.workers == 1 else "uvloop"
    command = [sys.executable, "-m", "uvicorn", f"bench_http_ceiling:{app}_app"]
    command += ["--app-dir", str(Path(__file__).parent)]
    command += ["--port", str(port), "--workers", str(args.workers), "--loop", loop, "--http", "httptools"]
    command += ["--log-level", "warning", "--no-access-log"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, server)
        out: dict[str, float] = {}
        for name in ("remember", "recall"):
            wrk(url, "bench", args.clients, 1.0, name)  # warm-up
            figures = wrk(url, "bench", args.clients, args.seconds, name)
            out.update({f"{app}_{name}_{k}": v for k, v in figures.items()})
        return out
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = load_options(__doc__)
    parser.add_argument("--apps", default="fastapi,starlette,asgi")
    args = parser.parse_args()
    load_before = os.getloadavg()
    apps = args.apps.split(",")
    rounds = [{k: v for app in apps for k, v in run_round(app, args).items()} for _ in range(args.rounds)]
    results: dict[str, Any] = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    results |= {"rounds": args.rounds, "clients": args.clients, "workers": args.workers, "load_generator": "wrk"}
    results["loadavg_before"] = " ".join(f"{x:.2f}" for x in load_before)
    results["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results["machine"] = machine()
    targets = {f"{app}_{name}": bound for app in apps for name, bound in TARGETS.items()}
    print_results(results, targets, as_json=args.json)


if __name__ == "__main__":
    main()
