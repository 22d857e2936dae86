"""The dashboard: server-rendered pages under ``/`` (design §3.2).

Every page is complete HTML (tables readable without JavaScript); charts are drawn by
uPlot, shipped in ``static/vendor`` (lab networks are often closed: no CDN). Pages read
through the same services as the JSON API, so a page and its API answer agree.

Access: where reads are open (``open_reads``) pages need nothing; otherwise a reader
token, asked once by a form and kept in an HttpOnly cookie (or sent as a bearer header).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from numparity_server.audit import export as audit_export
from numparity_server.audit import service as audit_service
from numparity_server.auth.service import authenticate
from numparity_server.catalog import service as catalog
from numparity_server.compiled.service import compiled_against_eager
from numparity_server.dashboard import manual, service
from numparity_server.dashboard.origin import same_origin, serialise
from numparity_server.deps import (
    DbSession,
    Kept,
    KeptReads,
    Offset,
    PolicyDep,
    ReadBudget,
    SettingsDep,
    require_reader,
)
from numparity_server.goldens import service as goldens_service
from numparity_server.kit.errors import Forbidden, Unauthorized
from numparity_server.nodes.service import node_timeline

HERE = Path(__file__).parent
COOKIE = "numparity_token"
COOKIE_MAX_AGE_S = 30 * 24 * 3600
# Node names listed per group on a workload page (a 10,000-node group is a long page).
MAX_GROUP_NODES = 50
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(include_in_schema=False)
# Paths that are not pages: their errors stay JSON (the API's contract).
NOT_PAGES = ("/api/", "/metrics", "/healthz", "/readyz", "/docs", "/redoc", "/openapi.json",
             "/static/")


class LoginRequired(Exception):
    """A page was asked for without a usable reader token: off to the token form."""

    def __init__(self, why: str = "") -> None:
        super().__init__(why)
        self.why = why


# Why the form is shown again (``?why=``): the sign-in page says it in words.
WHY = {"unknown": "That token is unknown to this server.",
       "revoked": "That token has been revoked.",
       "role": "That token cannot read: a reader (or admin) token is needed."}


def page_reader(request: Request, session: DbSession, settings: SettingsDep) -> None:
    """The API's read rule (``require_reader``), with the token from a bearer header or
    the cookie, and the sign-in form instead of a 401."""
    token = request.cookies.get(COOKIE)
    authorization = request.headers.get("authorization") or (f"Bearer {token}" if token
                                                              else None)
    try:
        require_reader(session, settings, authorization)
    except Forbidden:
        raise LoginRequired("role") from None
    except Unauthorized as exc:
        why = ("" if authorization is None else
               "revoked" if "revoked" in str(exc.detail) else "unknown")
        raise LoginRequired(why) from None


PageReader = Annotated[None, Depends(page_reader)]


def posted_here(request: Request, settings: SettingsDep) -> None:
    """A form posted by another site is refused: 403, the page saying why (see
    ``dashboard.origin``)."""
    origin = request.headers.get("origin")
    source = origin if origin is not None else request.headers.get("referer")
    here = settings.public_url or request.headers.get("host") or "this server"
    if source is None:
        raise Forbidden(f"Refused: the request names neither Origin nor Referer, so it "
                        f"cannot be told from a form another site posted. Sign in from "
                        f"this server's own page ({here}) in a browser.")
    if not same_origin(source, host=request.headers.get("host"),
                       public_url=settings.public_url):
        raise Forbidden(f"Refused: this form was sent from {serialise(source)}, not from "
                        f"this server ({here}); a site cannot sign you in or out here. "
                        f"Sign in from this server's own page.")


PostedHere = Annotated[None, Depends(posted_here)]


def no_value(why: str) -> Markup:
    """A "—" that says why there is no value (its tooltip): no dash goes unexplained."""
    return Markup('<span class="none" title="{}">—</span>').format(why)


def _fmt_time(value: Any, why: str = "not recorded") -> str:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return no_value(why) if value is None else str(value)


def _fmt_num(value: Any, digits: int = 3, why: str = "no value") -> str:
    if value is None:
        return no_value(why)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if value == 0 or isinstance(value, int):
        return str(int(value)) if value == int(value) else str(value)
    return f"{value:.{digits}g}" if 1e-3 <= abs(value) < 1e5 else f"{value:.{digits - 1}e}"


templates.env.filters["time"] = _fmt_time
templates.env.filters["num"] = _fmt_num
templates.env.filters["short"] = lambda value, n=12: (value or "")[:n]
templates.env.globals["compare_url"] = service.compare_url
templates.env.globals["no_value"] = no_value
templates.env.globals["quote"] = lambda value: quote(str(value), safe="")


def _aged(response: HTMLResponse, kept: Kept) -> HTMLResponse:
    """The page with its answer's ``Age`` (``kit.readcache``)."""
    response.headers.update(kept.headers)
    return response


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The page ``name``, its header linking the manual's section that explains it."""
    context.setdefault("manual_help", manual.help_url(name))
    return templates.TemplateResponse(request, name, context, status_code=status_code)


# ---- pages ------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
async def fleet(request: Request, session: DbSession, policy: PolicyDep, settings: SettingsDep,
                _reader: PageReader, kept: KeptReads, suite: str = "standard",
                limit: Annotated[int, Query(ge=1)] = 100,
                offset: Offset = 0) -> HTMLResponse:
    limit = min(limit, settings.page_max)
    view = await run_in_threadpool(kept, ("fleet page", suite, limit, offset), lambda: (
        service.overview(session=session, policy=policy, suite=suite, limit=limit,
                         offset=offset)))
    return _aged(render(request, "overview.html", view=view, title="Fleet"), kept)


@router.get("/workloads", response_class=HTMLResponse)
async def workloads_page(request: Request, session: DbSession, settings: SettingsDep,
                         _reader: PageReader, suite: str | None = None,
                         limit: Annotated[int, Query(ge=1)] = 100,
                         offset: Offset = 0
                         ) -> HTMLResponse:
    limit = min(limit, settings.page_max)
    listing = await run_in_threadpool(catalog.suites, session=session, suite=suite or None,
                                      limit=limit, offset=offset)

    def pager(to: int) -> str:
        return urlencode({**({"suite": suite} if suite else {}), "limit": limit,
                          "offset": max(to, 0)})

    return render(request, "workloads.html", listing=listing, suite=suite, pager=pager,
                  title="Workloads")


@router.get("/workloads/{workload}", response_class=HTMLResponse)
async def workload_page(request: Request, workload: str, session: DbSession, policy: PolicyDep,
                        _reader: PageReader, kept: KeptReads, budget: ReadBudget,
                        suite: str = "standard", tensor: str | None = None) -> HTMLResponse:
    page = await run_in_threadpool(
        kept, ("workload page", suite, workload, tensor), lambda: (
            service.workload_page(session=session, policy=policy, suite=suite,
                                  workload=workload, tensor=tensor,
                                  members_limit=MAX_GROUP_NODES, budget=budget)),
        lambda page: not page["pending"])
    return _aged(render(request, "workload.html", page=page, title=f"Workload {workload}"),
                 kept)


@router.get("/nodes/{name}", response_class=HTMLResponse)
async def node_page(request: Request, name: str, session: DbSession, settings: SettingsDep,
                    policy: PolicyDep, _reader: PageReader, budget: ReadBudget,
                    limit: Annotated[int, Query(ge=1)] = 100,
                    offset: Offset = 0) -> HTMLResponse:
    limit = min(limit, settings.page_max)
    timeline = await run_in_threadpool(node_timeline, session=session, name=name, limit=limit,
                                       offset=offset)
    findings = await run_in_threadpool(service.device_findings, session=session,
                                       policy=policy, node=name)
    runs = timeline.runs.items
    # The newest run's compiled results against its eager ones (design §3.3.18).
    compiled = await run_in_threadpool(
        compiled_against_eager, session=session, policy=policy, run_id=runs[0].run_id,
        budget=budget) if runs and offset == 0 else None
    return render(request, "node.html", node=timeline, runs=runs, findings=findings,
                  compiled=compiled,
                  chart=service.timeline_points(runs), title=f"Node {name}",
                  newer=offset > 0, older=offset + limit < timeline.runs.total,
                  limit=limit, offset=offset)


@router.get("/compare", response_class=HTMLResponse)
async def compare_page(request: Request, session: DbSession, policy: PolicyDep,
                       settings: SettingsDep, _reader: PageReader, budget: ReadBudget,
                       run_a: Annotated[str, Query(min_length=1)],
                       run_b: Annotated[str, Query(min_length=1)],
                       workload: str | None = None, variant: str | None = None,
                       device_a: Annotated[str | None, Query(max_length=64)] = None,
                       device_b: Annotated[str | None, Query(max_length=64)] = None,
                       limit: Annotated[int | None, Query(ge=1)] = None,
                       offset: Offset = 0) -> HTMLResponse:
    # A page of tensor rows (page_max by default: most comparisons fit on one).
    limit = min(limit or settings.page_max, settings.page_max)
    compared, charts = await run_in_threadpool(
        service.comparison, session=session, policy=policy, run_a=run_a, run_b=run_b,
        workload=workload or None, variant=variant or None, device_a=device_a or None,
        device_b=device_b or None, limit=limit, offset=offset, budget=budget)
    here = request.url.include_query_params(limit=limit)
    return render(request, "compare.html", compared=compared,
                  pairs=list(zip(compared.pairs, charts, strict=True)),
                  prev_url=str(here.include_query_params(offset=max(offset - limit, 0)))
                  if offset > 0 else None,
                  next_url=str(here.include_query_params(offset=offset + limit))
                  if offset + limit < compared.tensors_total else None,
                  title=f"{compared.run_a.node} vs {compared.run_b.node}")


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request, session: DbSession, policy: PolicyDep,
                     settings: SettingsDep, _reader: PageReader, kept: KeptReads
                     ) -> HTMLResponse:
    # The API's first page (GET /api/v1/audit without limit): one computation for both.
    rows = min(settings.page_default, settings.page_max)
    report = await run_in_threadpool(
        kept, ("audit", rows, 0), lambda: audit_service.audit(
            session=session, policy=policy, limit=rows))
    pins = await run_in_threadpool(lambda: goldens_service.list_pins(
        session=session, suite=None, model=None, in_force=True, limit=rows, offset=0).items)
    return _aged(render(request, "audit.html", report=report, pins=pins, title="Audit"), kept)


@router.get("/audit.csv")
async def audit_csv(session: DbSession, policy: PolicyDep, _reader: PageReader,
                    kept: KeptReads, table: str = "findings") -> Response:
    """The audit's CSV for a browser that holds the cookie (the API wants a bearer)."""
    audit_export.check_table(table)
    report = await run_in_threadpool(kept, ("audit", "all"), lambda: audit_service.audit(
        session=session, policy=policy))
    body = audit_export.to_csv(report, table)
    return Response(body, media_type="text/csv", headers={
        **kept.headers,
        "Content-Disposition": f'attachment; filename="numparity-audit-{table}.csv"'})


# ---- the token prompt -------------------------------------------------------------------


def _local(target: str | None) -> str:
    """Only a path on this server may follow a login (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/", why: str = "") -> HTMLResponse:  # noqa: A002
    return render(request, "login.html", next=_local(next), message=WHY.get(why, ""),
                  title="Sign in")


@router.post("/login", response_model=None)
def login(request: Request, session: DbSession, _here: PostedHere,
          token: Annotated[str, Form()] = "",
          next: Annotated[str, Form()] = "/") -> Response:  # noqa: A002
    target = _local(next)
    try:
        authenticate(session=session, authorization=f"Bearer {token.strip()}", role="reader")
    except (Unauthorized, Forbidden) as exc:
        message = str(exc.detail) if token.strip() else "enter a token"
        return render(request, "login.html", status_code=401, next=target,
                      message=f"Not accepted: {message}.", title="Sign in")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token.strip(), max_age=COOKIE_MAX_AGE_S, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https", path="/")
    return response


@router.post("/logout")
def logout(_here: PostedHere) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# ---- errors as pages --------------------------------------------------------------------


def is_page(request: Request) -> bool:
    return not request.url.path.startswith(NOT_PAGES)


def error_page(request: Request, status_code: int, detail: Any) -> HTMLResponse:
    titles = {400: "Bad request", 401: "Sign in", 403: "Forbidden", 404: "Not found",
              422: "Invalid request", 503: "Unavailable"}
    if status_code == 404 and detail == "Not Found":  # no route at all
        detail = f"there is no page at {request.url.path}"
    return render(request, "error.html", status_code=status_code,
                  heading=titles.get(status_code, "Error"), messages=_messages(detail),
                  title=titles.get(status_code, "Error"))


async def no_manual(scope: Scope, receive: Receive, send: Send) -> None:
    """/manual/… where this server has no built manual (an editable install)."""
    response = render(Request(scope, receive), "error.html", status_code=404,
                      title="No manual", heading="No manual on this server", messages=[
                      "This server was installed without its manual: a wheel carries it, "
                      "an editable install from a checkout does not.",
                      "Build it in the checkout with `make docs` (it writes site/) and "
                      "start the server with NUMPARITY_MANUAL_DIR naming that folder.",
                  ])
    await response(scope, receive, send)


def _messages(detail: Any) -> list[str]:
    """Readable lines from an error's detail (a string, or validation errors)."""
    if isinstance(detail, list):
        lines = []
        for error in detail:
            if isinstance(error, dict):
                where = ".".join(str(part) for part in error.get("loc", ())
                                 if part not in ("query", "path", "body"))
                got = error.get("input")
                suffix = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
                lines.append(f"{where}: {error.get('msg', '')}{suffix}" if where
                             else str(error.get("msg", "")))
            else:
                lines.append(str(error))
        return lines
    return [str(detail)]


def install(app: FastAPI) -> None:
    """Mount the pages, their static files, and the token prompt for closed reads."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    folder = manual.manual_folder(app.state.settings)
    app.mount(manual.PREFIX, manual.ManualFiles(folder) if folder is not None else no_manual,
              name="manual")

    async def on_login_required(request: Request, exc: Exception) -> Response:
        # To the form (a page of its own, so the browser shows no failed request), and
        # back to this page once signed in. A cookie that no longer works is dropped.
        assert isinstance(exc, LoginRequired)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        query = {"next": _local(target), **({"why": exc.why} if exc.why else {})}
        response = RedirectResponse("/login?" + urlencode(query), status_code=303)
        if exc.why and COOKIE in request.cookies:
            response.delete_cookie(COOKIE, path="/")
        return response

    app.add_exception_handler(LoginRequired, on_login_required)

