"""The dashboard's alerts: a list, each alert with the timelines of the series that moved at
its commit, and its triage (``db.alerts``).

Every page and ``/api/alerts`` only read. The one write is the triage form's POST
(``/alerts/{id}/state``): it passes the token gate like every request (so it needs the
dashboard's token, or a user's, when one is set), is recorded under the user whose token it
carries (the shared token's holder is recorded as ``dashboard``; a dashboard without tokens
records the local OS user, unchecked), and opens its own write connection for that one change:
the rest of the server keeps its read-only store.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from db.alerts import ALERT_STATES, TRIAGE_STATES, AlertRecord
from db.store import Store
from harness.access.caller import local_user
from harness.history.alerting import alert_document
from harness.identity import commit_order
from harness.web.data import FarmData
from reports.history import first_run_order, history, revision_runs, timeline_figures

SHARED_TOKEN_ACTOR = "dashboard"  # who a change made with the shared token is recorded as
NOTE_CHARS = 500


def offered_token(request: Request, cookie: str) -> str:
    """The token a request carries: its bearer header, else its cookie."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else request.cookies.get(cookie, "")


def timelines(store: Store, alert: AlertRecord) -> list[tuple[str, str]]:
    """The timelines (one per device and metric) of the series that moved at the alert's
    commit, every revision of the experiment on the x axis."""
    runs = revision_runs(store, alert.experiment)
    order = commit_order(first_run_order(runs))
    figures = []
    for metric in dict.fromkeys(s.metric for s in alert.steps):
        moved = [s for s in alert.steps if s.metric == metric]
        hist = history(runs, order, metric, devices=sorted({s.device for s in moved}),
                       configs=sorted({s.config for s in moved}))
        figures += timeline_figures(hist)
    return figures


def alert_routes(data: FarmData, actor_of: Callable[[Request], tuple[str, bool]],
                 page: Callable[..., Response]) -> list[Route]:
    """The alerts' routes; ``actor_of`` names who a request's token is, and whether a user's
    token said so (the gate has admitted the request already)."""

    def alert_of(request: Request) -> AlertRecord:
        return data.store.alerts.get(request.path_params["alert_id"])

    def listing(request: Request) -> Response:
        state = request.query_params.get("state")
        if state is not None and state not in ALERT_STATES:
            raise HTTPException(400, f"state {state!r}: one of {', '.join(ALERT_STATES)}")
        return page("alerts.html", alerts=data.store.alerts.list([state] if state else []),
                    state=state, states=ALERT_STATES)

    def detail(request: Request) -> Response:
        alert = alert_of(request)
        return page("alert.html", alert=alert, figures=timelines(data.store, alert),
                    triage=TRIAGE_STATES)

    def api_list(_request: Request) -> JSONResponse:
        return JSONResponse([alert_document(a) for a in data.store.alerts.list()])

    def api_detail(request: Request) -> JSONResponse:
        return JSONResponse(alert_document(alert_of(request)))

    def change(request: Request, form: dict[str, list[str]]) -> AlertRecord:
        state = (form.get("state") or [""])[0]
        if state not in TRIAGE_STATES:
            raise HTTPException(400, f"state {state!r}: one of {', '.join(TRIAGE_STATES)}")
        note = (form.get("note") or [""])[0].strip()[:NOTE_CHARS] or None
        actor, checked = actor_of(request)
        with Store.open(data.url, create=False) as store:
            alert, _ = store.alerts.change(request.path_params["alert_id"], state, actor,
                                           checked, note)
        return alert

    async def triage(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        alert = await run_in_threadpool(change, request, form)
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse(alert_document(alert))
        return RedirectResponse(f"/alerts/{alert.id}", 303)

    return [
        Route("/alerts", listing),
        Route("/alerts/{alert_id:int}", detail),
        Route("/alerts/{alert_id:int}/state", triage, methods=["POST"]),
        Route("/api/alerts", api_list),
        Route("/api/alerts/{alert_id:int}", api_detail),
    ]


def request_actor(data: FarmData, shared: str | None, cookie: str
                  ) -> Callable[[Request], tuple[str, bool]]:
    """Who a request is: the user whose token it carries (checked), ``dashboard`` for the
    shared token, the local OS user when the dashboard asks for none."""
    def actor(request: Request) -> tuple[str, bool]:
        offered = offered_token(request, cookie)
        user = data.user_of(offered) if offered else None
        if user:
            return user, True
        return (SHARED_TOKEN_ACTOR if shared is not None else local_user()), False
    return actor

