"""Real HTTP servers on loopback for the service tests: a uvicorn server in a thread, and an app that misbehaves on
purpose in every way a reward service can (tests/test_services*.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

TEN_MB = 10 * 1024 * 1024


@contextmanager
def serving(app, port: int = 0) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (``port`` 0: a free one) in a thread; yields the base URL; stopped on every exit
    path (uvicorn's should_exit, then the thread joined)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="error", lifespan="off", timeout_graceful_shutdown=1
    )  # a hung request must not hold the stop
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-service", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def rlzoo_results(body: dict, reward=None) -> dict:
    """rlzoo's protocol: reward 1 when the response equals the answer, else 0 (or ``reward`` for every item)."""
    items = body["items"]
    return {
        "results": [
            {
                "reward": reward if reward is not None else float(i["response"] == i["answer"]),
                "info": {"seen": i["metadata"]},
            }
            for i in items
        ]
    }


def faulty_app() -> FastAPI:
    """Routes named after how they behave; ``calls`` counts the POSTs each path got (tests read it). ``/flaky/K``
    answers 500 to its first two calls per key K, ``/busy/K`` 429 with ``Retry-After: 1`` to its first."""
    app = FastAPI()
    calls: Counter[str] = Counter()
    app.state.calls = calls

    @app.middleware("http")
    async def count(request: Request, call_next):
        if request.method == "POST":
            calls[request.url.path] += 1
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/ok")
    async def ok(request: Request) -> dict:
        return rlzoo_results(await request.json())

    @app.post("/flaky/{key}")
    async def flaky(key: str, request: Request):
        if calls[f"/flaky/{key}"] <= 2:
            return JSONResponse({"detail": "overloaded"}, status_code=500)
        return rlzoo_results(await request.json())

    @app.post("/busy/{key}")
    async def busy(key: str, request: Request):
        if calls[f"/busy/{key}"] <= 1:
            return JSONResponse({"detail": "slow down"}, status_code=429, headers={"Retry-After": "1"})
        return rlzoo_results(await request.json())

    @app.post("/always500")
    async def always500() -> Response:
        return JSONResponse({"detail": "broken"}, status_code=500)

    app.state.in_flight = app.state.peak = 0

    @app.post("/slow")
    async def slow(request: Request) -> dict:
        app.state.in_flight += 1
        app.state.peak = max(app.state.peak, app.state.in_flight)
        try:
            await asyncio.sleep(0.2)
            return rlzoo_results(await request.json())
        finally:
            app.state.in_flight -= 1

    @app.post("/hang")
    async def hang() -> dict:
        await asyncio.sleep(30)
        return {}

    @app.post("/html")
    async def html() -> HTMLResponse:
        return HTMLResponse("<html><body>502 Bad Gateway</body></html>")

    @app.post("/malformed")
    async def malformed() -> Response:
        return Response('{"results": [{"reward": 1.0', media_type="application/json")

    @app.post("/empty")
    async def empty() -> Response:
        return Response(b"", media_type="application/json")

    @app.post("/out_of_range")
    async def out_of_range(request: Request) -> dict:
        return rlzoo_results(await request.json(), reward=7.0)

    @app.post("/nan")
    async def nan(request: Request) -> Response:
        count = len((await request.json())["items"])
        return Response('{"results": [' + ",".join(['{"reward": NaN}'] * count) + "]}", media_type="application/json")

    @app.post("/steps/{kind}")
    async def bad_steps(kind: str, request: Request) -> Response:
        steps = {
            "nan": '[{"reward": NaN, "span": [0, 1]}]',
            "no_span": '[{"reward": 1.0}]',
            "backwards": '[{"reward": 1.0, "span": [3, 1]}]',
            "not_a_list": '{"reward": 1.0}',
        }[kind]
        count = len((await request.json())["items"])
        item = '{"reward": 1.0, "steps": ' + steps + "}"
        return Response('{"results": [' + ",".join([item] * count) + "]}", media_type="application/json")

    @app.post("/short")
    async def short(request: Request) -> dict:
        return {"results": rlzoo_results(await request.json())["results"][:-1]}

    @app.post("/huge")
    async def huge() -> Response:
        return Response(b'{"results": "' + b"x" * TEN_MB + b'"}', media_type="application/json")

    @app.post("/huge_stream")
    async def huge_stream():
        from fastapi.responses import StreamingResponse

        async def chunks():  # no content-length: the limit must hold while reading
            for _ in range(10):
                yield b"x" * (TEN_MB // 10)

        return StreamingResponse(chunks(), media_type="application/json")

    @app.post("/bad_request")
    async def bad_request() -> Response:
        return JSONResponse({"detail": "no"}, status_code=400)

    @app.post("/openrlhf")
    async def openrlhf(request: Request) -> dict:
        body = await request.json()
        return {"rewards": [float(q.endswith(label)) for q, label in zip(body["query"], body["labels"])]}

    @app.post("/auth")
    async def auth(request: Request):
        if request.headers.get("authorization") != "Bearer sesame":
            return JSONResponse({"detail": "bad key"}, status_code=401)
        return rlzoo_results(await request.json())

    return app
