"""The dashboard's web app (Starlette): pages rendered with Jinja2, a JSON API, a token gate.

Read-only: every route is a GET except the login form. With a token, each request needs it,
as ``Authorization: Bearer TOKEN`` or the cookie the login page sets; without it, 401. Every
page is sent with a Content-Security-Policy allowing only the app's own script, and Jinja2
escapes every value (the live script writes values with textContent only).
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from db.connection import DatabaseFailure
from db.errors import StoreError, StoreInputError
from db.leases import utcnow
from db.records import RUN_STATUSES
from harness import REPO_ROOT
from harness.errors import BenchfarmError
from harness.web.data import MAX_JOB_ID, FarmData, Page, as_json, page_bounds
from harness.web.limits import BodyLimit
from reports.audit.report import audit_html, audit_json
from reports.errors import ReportError
from reports.tables import CSS, fmt

HERE = Path(__file__).resolve().parent
CLAIMS_DIR = REPO_ROOT / "claims"
COOKIE = "benchfarm_token"
LOGIN_PATH = "/login"
HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; connect-src 'self'; "
     b"style-src 'self' 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
     b"frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


def _when(moment: Any) -> str:
    return "" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} m" if hours else f"{minutes} m {secs:02d} s"


# the results table of an experiment page: GroupSummary fields and their headers
RESULTS = [("command", "command"), ("policy", "policy"), ("k", "k"), ("device", "device"),
           ("runs", "runs"), ("decode_ms_per_token", "decode ms/tok"),
           ("attn_ms_per_token", "attn ms/tok"), ("overhead_ms", "overhead ms"),
           ("recall", "recall"), ("ppl", "ppl")]


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
    env.filters.update(when=_when, duration=_duration, num=fmt)
    env.globals.update(report_css=Markup(CSS), statuses=RUN_STATUSES,
                       result_keys=[key for key, _ in RESULTS],
                       result_columns=[title for _, title in RESULTS])
    return env


@asynccontextmanager
async def _closing(data: FarmData) -> AsyncIterator[None]:
    try:
        yield
    finally:
        data.close()


class TokenGate:
    """Security headers on every response; with a token, 401 for requests without it."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    def _allowed(self, scope: Scope) -> bool:
        if self.token is None or scope["path"] == LOGIN_PATH:
            return True
        request = Request(scope)
        offered = request.cookies.get(COOKIE, "")
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            offered = credentials.strip()
        return hmac.compare_digest(offered.encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        if self._allowed(scope):
            await self.app(scope, receive, send_with_headers)
            return
        if scope["path"].startswith("/api/"):
            response: Response = JSONResponse({"error": "a token is required"}, 401)
        else:
            response = HTMLResponse(_templates().get_template("login.html").render(
                refused=False), 401)
        response.headers["www-authenticate"] = "Bearer"
        await response(scope, receive, send_with_headers)


def create_app(url: str, token: str | None = None, claims_dir: Path = CLAIMS_DIR) -> Starlette:
    """The dashboard of the store at ``url``; ``token`` (if any) gates every request; the
    audit page offers the claims files in ``claims_dir``."""
    data = FarmData(url, claims_dir)
    templates = _templates()

    def page(name: str, code: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("now", utcnow())
        return HTMLResponse(templates.get_template(name).render(store=data.shown_url, **context),
                            code)

    def paging(request: Request) -> tuple[int, int]:
        try:
            return page_bounds(request.query_params.get("limit"),
                               request.query_params.get("offset"))
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    def paged(request: Request, listed: Page) -> JSONResponse:
        """A page of a list as JSON: the items, the total in a header, the next page linked."""
        response = JSONResponse(as_json(listed.items))
        response.headers["x-total-count"] = str(listed.total)
        end = listed.offset + len(listed.items)
        if end < listed.total:
            response.headers["link"] = (f"<{request.url.path}?offset={end}&limit="
                                        f"{paging(request)[0]}>; rel=\"next\"")
        return response

    def index(request: Request) -> HTMLResponse:
        limit, offset = paging(request)
        return page("index.html", boards=data.boards(), jobs=data.jobs(),
                    queued=data.queue_total(), experiments=data.experiments(limit, offset),
                    limit=limit)

    def experiment(request: Request) -> HTMLResponse:
        name = request.path_params["name"]
        view = data.experiment(name)
        history, report = data.report_html(name)
        return page("experiment.html", experiment=view, history=history, report=report)

    def api_boards(_request: Request) -> JSONResponse:
        return JSONResponse(as_json(data.boards()))

    def api_jobs(_request: Request) -> JSONResponse:
        return JSONResponse(as_json(data.jobs()))

    def api_job(request: Request) -> JSONResponse:
        if not 0 < request.path_params["job_id"] <= MAX_JOB_ID:  # checked before the store
            raise HTTPException(400, f"job {request.path_params['job_id']}: a job id is from 1 "
                                f"to {MAX_JOB_ID}")
        job = data.job(request.path_params["job_id"])
        if job is None:
            raise HTTPException(404, f"no job {request.path_params['job_id']} in the store")
        return JSONResponse(as_json(job))

    def api_experiments(request: Request) -> JSONResponse:
        return paged(request, data.experiments(*paging(request)))

    def api_experiment(request: Request) -> JSONResponse:
        return JSONResponse(as_json(data.experiment(request.path_params["name"])))

    def audits(_request: Request) -> HTMLResponse:
        return page("audit.html", files=data.claims_files(), claims=None, verdicts="")

    def verdicts(request: Request) -> list[Any]:
        found = data.audit(request.path_params["claims"])
        if found is None:
            raise HTTPException(404, f"no claims file {request.path_params['claims']!r} in "
                                f"{data.claims_dir}")
        return found

    def audit(request: Request) -> HTMLResponse:
        return page("audit.html", files=data.claims_files(),
                    claims=request.path_params["claims"],
                    verdicts=Markup(audit_html(verdicts(request))))

    def api_audit(request: Request) -> Response:
        return Response(audit_json(verdicts(request)), media_type="application/json")

    def script(_request: Request) -> FileResponse:
        return FileResponse(HERE / "static" / "live.js", media_type="text/javascript")

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return page("login.html", refused=False)
        offered = parse_qs((await request.body()).decode("utf-8", "replace")).get("token", [""])
        if token is None:
            return RedirectResponse("/", 303)
        if not hmac.compare_digest(offered[0].encode(), token.encode()):
            return page("login.html", 401, refused=True)
        response = RedirectResponse("/", 303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    def failure(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status)
        return page("error.html", status, status=status, message=message)

    def store_failed(request: Request, exc: Exception) -> Response:
        if isinstance(exc, StoreInputError) and "no experiment named" in str(exc):
            return failure(request, 404, str(exc))
        reason = (str(getattr(exc, "orig", None) or exc).splitlines() or [type(exc).__name__])
        return failure(request, 503, f"cannot read the store: {reason[0]}")

    def bad_input(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "exit_code", 1)
        return failure(request, 422 if code == 2 else 500, str(exc))

    def http_failed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return failure(request, exc.status_code, str(exc.detail))

    def crashed(request: Request, exc: Exception) -> Response:
        return failure(request, 500, f"the dashboard failed ({type(exc).__name__}); its log "
                       "has the details")

    routes = [
        Route("/", index),
        Route("/experiments/{name:path}", experiment),
        Route("/api/boards", api_boards),
        Route("/api/jobs", api_jobs),
        Route("/api/jobs/{job_id:int}", api_job),
        Route("/api/experiments", api_experiments),
        Route("/api/experiments/{name:path}", api_experiment),
        Route("/audit", audits),
        Route("/audit/{claims}", audit),
        Route("/api/audit/{claims}", api_audit),
        Route("/static/live.js", script),
        Route(LOGIN_PATH, login, methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        StoreError: store_failed, DatabaseFailure: store_failed, HTTPException: http_failed,
        BenchfarmError: bad_input, ReportError: bad_input,
        Exception: crashed},
        lifespan=lambda _app: _closing(data))
    app.add_middleware(TokenGate, token=token)
    app.add_middleware(BodyLimit)  # outermost: a body is capped before the token is looked at
    return app
