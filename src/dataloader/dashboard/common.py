"""What every page shares: the templates, who is looking (`viewer`), rendering, and the
filters that format a job's facts."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from dataloader.api.segments import segment
from dataloader.client import Client
from dataloader.config import Scope
from dataloader.core import display
from dataloader.core.staleness import current_freshness
from dataloader.dashboard.sessions import COOKIE, CSRF_FIELD, SESSION_SEC, Sessions, Viewer
from dataloader.health import SystemStatus
from dataloader.logger.utils import mask_mapping, mask_text

#: Where the dashboard is served.
PREFIX: Final = "/ui"
HERE: Final = Path(__file__).resolve().parent

templates = Jinja2Templates(directory=HERE / "templates")


def pretty_json(value: Any, omit: tuple[str, ...] = ()) -> str:
    """A JSON value indented for reading, secrets masked as the logs mask them (the
    template escapes it); an object without its keys `omit` (shown elsewhere)."""
    if omit and isinstance(value, dict):
        value = {key: item for key, item in value.items() if key not in omit}
    return json.dumps(mask_mapping(value), indent=2, ensure_ascii=False, default=str)


def masked(text: str | None) -> str:
    """Free text (an error, a traceback) with its secrets masked as the logs mask them."""
    return "" if text is None else mask_text(text)


def ago(moment: datetime | None) -> str:
    """How long ago `moment` was, in a few characters ("12 s", "3 min", "2 h", "4 d")."""
    if moment is None:
        return "—"
    seconds = (datetime.now(UTC) - moment).total_seconds()
    return span(seconds) + (" ago" if seconds >= 0 else " ahead")


def span(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def stamp(moment: datetime | None) -> str:
    return "—" if moment is None else display.stamp(moment)


class Verbatim(str):
    """Text a page gives back as it came (a filter's field holding what the viewer asked
    for): `shown` leaves its controls alone, so that submitting the form again asks the same."""


def shown(value: Any) -> Any:
    """What every `{{ … }}` of every page (and live fragment) prints: text with its
    bidirectional controls escaped (`display.visible`), whatever it holds (args, a result, an
    error, a key, a queue's name), so that what is on screen reads as the text is; then
    autoescaped as ever."""
    if isinstance(value, Verbatim):
        return value
    if isinstance(value, Markup):  # already HTML: its escapes are plain ASCII
        return Markup(display.visible(str(value)))
    if isinstance(value, str):
        return display.visible(value)
    return value


templates.env.finalize = shown
templates.env.filters.update(
    pretty_json=pretty_json,
    masked=masked,
    ago=ago,
    span=span,
    stamp=stamp,
    verbatim=Verbatim,
    segment=segment,  # a process's namespace or id in a URL: one segment, `/` encoded
)


class Pages:
    """What the routes of every page need: the client they read through, the sessions."""

    def __init__(self, client: Callable[[], Client], sessions: Sessions) -> None:
        self.client = client
        self.sessions = sessions


def pages_of(request: Request) -> Pages:
    pages: Pages = request.app.state.dashboard
    return pages


def client_of(request: Request) -> Client:
    return pages_of(request).client()


async def viewer_of(request: Request) -> Viewer:
    """Who is looking; a viewer without a session is sent to sign in (`SignInRequired`)."""
    sessions = pages_of(request).sessions
    viewer = sessions.viewer(request.cookies.get(COOKIE))
    if viewer is not None:
        return viewer
    if sessions.required:
        # back to the page asked for, with its query; after an action, to its page
        asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise SignInRequired(asked if request.method == "GET" else page_of(request))
    raise NewSession()


class SignInRequired(Exception):
    """The viewer must sign in first, then come back to `path` (a path of the dashboard,
    with its query)."""

    def __init__(self, path: str) -> None:
        self.path = path


class NewSession(Exception):
    """No authentication: the viewer gets a session (for CSRF) and comes back."""


PageClient = Annotated[Client, Depends(client_of)]
PageViewer = Annotated[Viewer, Depends(viewer_of)]


def authorize_action(request: Request, viewer: Viewer, csrf: str | None, scope: Scope) -> None:
    """403 unless the action comes from this site with the session's CSRF token, and the
    viewer's scope is at least `scope` (as the API asks of the same change)."""
    pages_of(request).sessions.check_action(viewer, csrf)
    if not viewer.may(scope):
        raise HTTPException(
            403, f"this token's scope is {viewer.scope.name}; {scope.name} is needed"
        )


def render(request: Request, viewer: Viewer, template: str, **context: Any) -> HTMLResponse:
    """The page `template` for `viewer`, with what every page shows."""
    return templates.TemplateResponse(
        request,
        template,
        {
            "viewer": viewer,
            "may_trigger": viewer.may(Scope.trigger),
            "may_admin": viewer.may(Scope.admin),
            "csrf_field": CSRF_FIELD,
            "prefix": PREFIX,
            # where its lists and counts were read, when they may be stale (DL_DB_READ_DSN)
            "freshness": current_freshness(),
            **context,
        },
        headers={"Cache-Control": "no-store"},
    )


#: The form field that confirms a destructive action (its value: "yes").
CONFIRM_FIELD: Final = "confirmed"


def confirm_page(
    request: Request,
    viewer: Viewer,
    *,
    title: str,
    question: str,
    action: str,
    button: str,
    back: str,
) -> HTMLResponse:
    """A destructive action asked for without its confirmation: the page that asks first,
    posting `action` again, confirmed (a page, not a script: it works without one)."""
    return render(
        request,
        viewer,
        "confirm.html",
        title=title,
        question=question,
        button=button,
        back=back,
        action=action,
        confirm_field=CONFIRM_FIELD,
    )


#: The title of an error page, by status.
ERROR_TITLES: Final = {
    400: "Bad request",
    403: "Not allowed",
    404: "Not found",
    409: "Not possible now",
    422: "Bad request",
}


def error_page(
    request: Request, status: int, message: str, again: str | None = None
) -> HTMLResponse:
    """A page saying what went wrong (`message`, shown escaped), for whoever is looking; with
    `again`, a link to that page to reload it and try again."""
    viewer = pages_of(request).sessions.viewer(request.cookies.get(COOKIE))
    page = templates.TemplateResponse(
        request,
        "error.html",
        {
            "viewer": viewer,
            "csrf_field": CSRF_FIELD,
            "prefix": PREFIX,
            "status": status,
            "title": ERROR_TITLES.get(status, "Something went wrong"),
            "message": message,
            "again": again,
        },
        status_code=status,
        headers={"Cache-Control": "no-store"},
    )
    return page


def render_system(status: SystemStatus) -> str:
    """The overview's warnings and queues (`_system.html`): the same for every viewer."""
    return templates.get_template("_system.html").render(status=status, prefix=PREFIX)


def render_queue_facts(queue: str, status: SystemStatus) -> str:
    """A queue's facts (`_queue_facts.html`) as `status` has them: the same for every
    viewer."""
    template = templates.get_template("_queue_facts.html")
    return template.render(name=queue, q=status.queues.get(queue), prefix=PREFIX)


def set_session(response: Response, value: str, request: Request) -> Response:
    response.set_cookie(
        COOKIE,
        value,
        max_age=SESSION_SEC,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=PREFIX,
    )
    return response


def safe_next(target: str) -> str | None:
    """`target` if it is a page of the dashboard given as a path of this site (with its query:
    `/ui/jobs?queue=q`), else None: what may follow a sign-in or a refused action without
    leading anywhere else (no scheme, no host, no `//` or backslash a browser would read as
    one, no control character)."""
    if not (target == PREFIX or target.startswith((f"{PREFIX}/", f"{PREFIX}?"))):
        return None
    if "\\" in target or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or parts.fragment:
        return None
    return target


def page_of(request: Request) -> str:
    """The dashboard's page a request was made from (its `Referer`, when that is one of this
    site's pages), else the overview: where a refused action sends the viewer back to."""
    referer = urlsplit(request.headers.get("referer", ""))
    if referer.netloc and referer.netloc != request.headers.get("host"):
        return PREFIX
    page = referer.path + (f"?{referer.query}" if referer.query else "")
    return safe_next(page) or PREFIX


def back_to(path: str) -> RedirectResponse:
    """After an action: the page it was made from (303: a GET)."""
    return RedirectResponse(path, status_code=303)
