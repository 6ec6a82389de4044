"""The floor of our HTTP stack: a bare FastAPI msgpack endpoint on the same uvicorn settings.

``python -m bench.floor_app --port P`` serves POST /echo (decode msgpack, answer msgpack).
"""

from __future__ import annotations

import argparse

import msgpack
import uvicorn
from fastapi import FastAPI, Request, Response

app = FastAPI()


@app.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@app.post("/echo")
async def echo(request: Request) -> Response:
    body = msgpack.unpackb(await request.body())
    return Response(msgpack.packb({"id": body.get("id"), "results": [None]}), media_type="application/msgpack")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, http="httptools", loop="uvloop", log_level="warning",
                access_log=False)
