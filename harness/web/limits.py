"""What one request to the dashboard may cost before anything else looks at it: its body.

``BodyLimit`` is the outermost middleware, so it runs before the token gate and the login: a
body declared longer than ``MAX_BODY_BYTES`` (``Content-Length``) is refused with 413 before a
byte of it is read, and one that is sent without a length (chunked) is cut off, 413 too, once
it passes the limit. The dashboard's only form (the login) is a few hundred bytes.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 64 << 10


class BodyTooLarge(Exception):
    """A request body past the limit (raised from ``receive`` to stop the app reading it)."""


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or len(declared) > 18
                                     or int(declared) > self.max_bytes):
            await self._refuse(scope, send)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        message = f"a request body may be at most {self.max_bytes} bytes"
        if scope.get("path", "").startswith("/api/"):
            body, kind = json.dumps({"error": message}).encode(), b"application/json"
        else:
            body, kind = message.encode(), b"text/plain; charset=utf-8"
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", kind),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
