"""The dashboard's sessions: signed cookies that name a token, never hold it, and end with
it; CSRF tokens bound to their session."""

from __future__ import annotations

import base64
import json
import time

import pytest
from pydantic import SecretStr

from dataloader.api.auth import Authenticator
from dataloader.config import ApiToken, Scope
from dataloader.dashboard import sessions
from dataloader.dashboard.sessions import Sessions

READ = "read-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"


def tokens(*pairs: tuple[str, str, str]) -> Authenticator:
    return Authenticator(
        [ApiToken(name=n, scope=Scope[s], token=SecretStr(t)) for n, s, t in pairs]
    )


AUTH = tokens(("viewer", "read", READ), ("ops", "admin", ADMIN))


#: The deployment's secret (DL_SESSION_SECRET, or the one kept in the database).
SECRET = b"the-deployments-secret-0123456789abcdef"


def of(auth: Authenticator, secret: bytes = SECRET) -> Sessions:
    return Sessions(auth, lambda: secret)


def test_a_session_names_its_token_and_never_holds_it() -> None:
    cookie = of(AUTH).sign_in(READ)
    assert cookie is not None
    assert READ not in cookie
    viewer = of(AUTH).viewer(cookie)  # another replica with the same tokens accepts it
    assert viewer is not None
    assert (viewer.name, viewer.scope, viewer.actor) == ("viewer", Scope.read, "token:viewer")
    assert not viewer.may(Scope.trigger)


def test_an_unknown_token_opens_no_session() -> None:
    assert of(AUTH).sign_in("wrong-token-0123456789abcdef") is None


def test_a_forged_expired_or_orphaned_session_is_refused() -> None:
    cookie = of(AUTH).sign_in(ADMIN)
    assert cookie is not None
    body, _, mac = cookie.rpartition(".")
    claims = json.loads(base64.urlsafe_b64decode(body))
    forged = base64.urlsafe_b64encode(json.dumps(claims | {"name": "root"}).encode()).decode()
    assert of(AUTH).viewer(f"{forged}.{mac}") is None
    assert of(AUTH).viewer(cookie[:-1] + ("0" if cookie[-1] != "0" else "1")) is None
    assert of(AUTH).viewer("") is None
    assert of(AUTH).viewer(None) is None
    # the token is gone from the configuration: its sessions end
    assert of(tokens(("ops", "admin", "other-token-0123456789abcdef"))).viewer(cookie) is None


def test_a_session_ends_after_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    cookie = of(AUTH).sign_in(READ)
    later = time.time() + sessions.SESSION_SEC + 1
    monkeypatch.setattr(sessions.time, "time", lambda: later)
    assert of(AUTH).viewer(cookie) is None


def test_each_session_has_its_own_csrf_token() -> None:
    first, second = of(AUTH).sign_in(READ), of(AUTH).sign_in(ADMIN)
    a, b = of(AUTH).viewer(first), of(AUTH).viewer(second)
    assert a is not None
    assert b is not None
    assert a.csrf != b.csrf
    assert a.csrf == of(AUTH).viewer(first).csrf  # type: ignore[union-attr]


def test_without_tokens_every_session_is_an_admin_of_the_deployment() -> None:
    open_ = of(tokens())
    cookie = open_.anonymous()
    viewer = open_.viewer(cookie)
    assert viewer is not None
    assert (viewer.name, viewer.scope, viewer.actor) == (None, Scope.admin, "dashboard")
    # another replica (or this one restarted) shares the secret: the session holds there
    assert of(tokens()).viewer(cookie) == viewer
    assert of(tokens(), b"another-deployments-secret-0123456789").viewer(cookie) is None
    assert of(AUTH).viewer(cookie) is None  # with tokens, an anonymous session is nobody


def test_the_key_needs_the_secret_and_the_tokens() -> None:
    cookie = of(AUTH).sign_in(ADMIN)
    assert of(AUTH).viewer(cookie) is not None
    assert of(AUTH, b"another-deployments-secret-0123456789").viewer(cookie) is None
