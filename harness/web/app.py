"""The dashboard's web app (Starlette): pages rendered with Jinja2, a JSON API, a token gate.

Read-only: every route is a GET except the login form and an alert's triage
(``harness.web.alerts``, behind the same gate). Once the store has users, or with a
shared token (``--token``, a single operator's), each request needs a token: an active user's
or the shared one, as ``Authorization: Bearer TOKEN`` or the cookie the login page sets;
without it, 401. The store is asked at each request, so a user added or revoked counts at
once; a store that cannot be read lets nothing through (503). Every
page is sent with a Content-Security-Policy allowing only the app's own script, and Jinja2
escapes every value (the live script writes values with textContent only).
"""

from __future__ import annotations

import hmac
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from db.boards import BOARD_STATES
from db.connection import DatabaseFailure
from db.errors import StoreError, StoreInputError
from db.jobs import JOB_STATES
from db.leases import utcnow
from db.records import RUN_STATUSES
from harness import REPO_ROOT
from harness.access.tokens import MIN_TOKEN_CHARS, check_token
from harness.errors import BenchfarmError
from harness.web.alerts import alert_routes, request_actor
from harness.web.data import FarmData
from harness.web.filters import Filters
from harness.web.limits import BodyLimit
from harness.web.timeline import KINDS, WINDOW
from harness.web.views import MAX_JOB_ID, Page, as_json, page_bounds
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
           ("revision", "revision"), ("runs", "runs"), ("decode_ms_per_token", "decode ms/tok"),
           ("attn_ms_per_token", "attn ms/tok"), ("overhead_ms", "overhead ms"),
           ("recall", "recall"), ("ppl", "ppl")]


def verdict_counts(verdicts: list[Any]) -> list[tuple[str, int]]:
    """How many claims got each grade, most first: each claim's ``grade`` in the audit's
    JSON where the audit gives one, else its ``verdict``."""
    documents = json.loads(audit_json(verdicts))
    return Counter(d.get("grade") or d["verdict"] for d in documents).most_common()


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
    env.filters.update(when=_when, duration=_duration, num=fmt)
    env.globals.update(report_css=Markup(CSS), statuses=RUN_STATUSES,
                       job_states=list(JOB_STATES), board_states=list(BOARD_STATES),
                       span_kinds=KINDS,
                       result_keys=[key for key, _ in RESULTS],
                       result_columns=[title for _, title in RESULTS])
    return env


@asynccontextmanager
async def _closing(data: FarmData) -> AsyncIterator[None]:
    try:
        yield
    finally:
        data.close()


def store_failure(exc: Exception) -> str:
    """What a page says when the store cannot be read."""
    reason = (str(getattr(exc, "orig", None) or exc).splitlines() or [type(exc).__name__])
    return f"cannot read the store: {reason[0]}"


class Logins:
    """Who may see the dashboard: the holder of the shared token (``--token``), if there is
    one, and every active user of the store, once it has users; anyone while it has neither."""

    def __init__(self, data: FarmData, shared: str | None) -> None:
        self.data = data
        self.shared = None if shared is None else check_token(shared, "the dashboard's token")

    def required(self) -> bool:
        return self.shared is not None or self.data.users_exist()

    def accepts(self, offered: str) -> bool:
        """Whether ``offered`` is the shared token or an active user's."""
        if len(offered) < MIN_TOKEN_CHARS:  # no token: blank, a form's "+", a guess
            return False
        if self.shared is not None and hmac.compare_digest(offered.encode(),
                                                           self.shared.encode()):
            return True
        return self.data.user_of(offered) is not None

    def admit(self, offered: str) -> bool:
        return not self.required() or self.accepts(offered)


class TokenGate:
    """Security headers on every response; 401 for requests the logins do not admit."""

    def __init__(self, app: ASGIApp, logins: Logins) -> None:
        self.app, self.logins = app, logins

    async def _allowed(self, scope: Scope) -> bool:
        if scope["path"] == LOGIN_PATH:
            return True
        request = Request(scope)
        offered = request.cookies.get(COOKIE, "")
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            offered = credentials.strip()
        return await run_in_threadpool(self.logins.admit, offered)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        try:
            allowed = await self._allowed(scope)
        except (StoreError, DatabaseFailure) as exc:  # who may see it is unknown: no one
            message = store_failure(exc)
            response: Response = (
                JSONResponse({"error": message}, 503) if scope["path"].startswith("/api/")
                else HTMLResponse(_templates().get_template("error.html").render(
                    status=503, message=message, now=utcnow(),
                    store=self.logins.data.shown_url), 503))
            await response(scope, receive, send_with_headers)
            return
        if allowed:
            await self.app(scope, receive, send_with_headers)
            return
        if scope["path"].startswith("/api/"):
            response = JSONResponse({"error": "a token is required"}, 401)
        else:
            response = HTMLResponse(_templates().get_template("login.html").render(
                refused=False), 401)
        response.headers["www-authenticate"] = "Bearer"
        await response(scope, receive, send_with_headers)


def create_app(url: str, token: str | None = None, claims_dir: Path = CLAIMS_DIR) -> Starlette:
    """The dashboard of the store at ``url``; ``token`` (if any: 16 characters or more, else
    TokenError) and the store's users' tokens gate every request; the audit page offers the
    claims files in ``claims_dir``."""
    data = FarmData(url, claims_dir)
    logins = Logins(data, token)
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

    def filters(request: Request) -> Filters:
        try:
            return Filters.of(request.query_params)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    def shown_boards(request: Request) -> list[Any]:
        return filters(request).boards(data.boards())

    def shown_jobs(request: Request) -> list[Any]:
        chosen = filters(request)
        classes = {b.name: b.cls for b in data.boards()} if chosen.board else {}
        return chosen.jobs(data.jobs(), classes)

    def shown_experiments(request: Request) -> Page:
        listed = data.experiments(*paging(request))
        return Page(filters(request).experiments(listed.items), listed.offset, listed.total)

    def index(request: Request) -> HTMLResponse:
        boards = shown_boards(request)
        now = utcnow()
        return page("index.html", boards=boards, jobs=shown_jobs(request),
                    queued=data.queue_total(), experiments=shown_experiments(request),
                    limit=paging(request)[0], filters=filters(request), now=now,
                    timelines=data.timelines([b.name for b in boards]),
                    window_start=now - WINDOW, window_s=WINDOW.total_seconds())

    def experiments_page(request: Request) -> HTMLResponse:
        return page("experiments.html", experiments=shown_experiments(request),
                    limit=paging(request)[0], filters=filters(request))

    def experiment(request: Request) -> HTMLResponse:
        name = request.path_params["name"]
        view = data.experiment(name)
        history, report = data.report_html(name)
        return page("experiment.html", experiment=view, history=history, report=report)

    def api_boards(request: Request) -> JSONResponse:
        return JSONResponse(as_json(shown_boards(request)))

    def api_timeline(request: Request) -> JSONResponse:
        return JSONResponse(as_json(data.timelines([b.name for b in shown_boards(request)])))

    def api_jobs(request: Request) -> JSONResponse:
        return JSONResponse(as_json(shown_jobs(request)))

    def job_id(request: Request) -> int:
        if not 0 < request.path_params["job_id"] <= MAX_JOB_ID:  # checked before the store
            raise HTTPException(400, f"job {request.path_params['job_id']}: a job id is from 1 "
                                f"to {MAX_JOB_ID}")
        return request.path_params["job_id"]

    def job_page(request: Request) -> HTMLResponse:
        story = data.story(job_id(request))
        if story is None:
            raise HTTPException(404, f"no job {request.path_params['job_id']} in the store")
        return page("job.html", job=story.job, story=story)

    def api_job(request: Request) -> JSONResponse:
        job = data.job(job_id(request))
        if job is None:
            raise HTTPException(404, f"no job {request.path_params['job_id']} in the store")
        return JSONResponse(as_json(job))

    def api_experiments(request: Request) -> JSONResponse:
        return paged(request, shown_experiments(request))

    def api_experiment(request: Request) -> JSONResponse:
        return JSONResponse(as_json(data.experiment(request.path_params["name"])))

    def audits(_request: Request) -> HTMLResponse:
        return page("audit.html", files=data.claims_files(), claims=None, counts=[],
                    verdicts="")

    def verdicts(request: Request) -> list[Any]:
        found = data.audit(request.path_params["claims"])
        if found is None:
            raise HTTPException(404, f"no claims file {request.path_params['claims']!r} in "
                                f"{data.claims_dir}")
        return found

    def audit(request: Request) -> HTMLResponse:
        found = verdicts(request)
        return page("audit.html", files=data.claims_files(),
                    claims=request.path_params["claims"], counts=verdict_counts(found),
                    verdicts=Markup(audit_html(found)))

    def api_audit(request: Request) -> Response:
        return Response(audit_json(verdicts(request)), media_type="application/json")

    def script(_request: Request) -> FileResponse:
        return FileResponse(HERE / "static" / "live.js", media_type="text/javascript")

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return page("login.html", refused=False)
        offered = parse_qs((await request.body()).decode("utf-8", "replace")).get("token", [""])
        if not await run_in_threadpool(logins.required):
            return RedirectResponse("/", 303)
        if not await run_in_threadpool(logins.accepts, offered[0]):
            return page("login.html", 401, refused=True)
        response = RedirectResponse("/", 303)
        response.set_cookie(COOKIE, offered[0], httponly=True, samesite="strict")
        return response

    def failure(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status)
        return page("error.html", status, status=status, message=message)

    def store_failed(request: Request, exc: Exception) -> Response:
        if isinstance(exc, StoreInputError) and "no experiment named" in str(exc):
            return failure(request, 404, str(exc))
        return failure(request, 503, store_failure(exc))

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
        Route("/experiments", experiments_page),
        Route("/experiments/{name:path}", experiment),
        Route("/api/boards", api_boards),
        Route("/api/timeline", api_timeline),
        Route("/api/jobs", api_jobs),
        Route("/api/jobs/{job_id:int}", api_job),
        Route("/jobs/{job_id:int}", job_page),
        Route("/api/experiments", api_experiments),
        Route("/api/experiments/{name:path}", api_experiment),
        Route("/audit", audits),
        Route("/audit/{claims}", audit),
        Route("/api/audit/{claims}", api_audit),
        Route("/static/live.js", script),
        Route(LOGIN_PATH, login, methods=["GET", "POST"]),
        *alert_routes(data, request_actor(data, logins.shared, COOKIE), page),
    ]
    app = Starlette(routes=routes, exception_handlers={
        StoreError: store_failed, DatabaseFailure: store_failed, HTTPException: http_failed,
        BenchfarmError: bad_input, ReportError: bad_input,
        Exception: crashed},
        lifespan=lambda _app: _closing(data))
    app.add_middleware(TokenGate, logins=logins)
    app.add_middleware(BodyLimit)  # outermost: a body is capped before the token is looked at
    return app
