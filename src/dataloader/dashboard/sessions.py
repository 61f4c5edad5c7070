"""Who looks at the dashboard, and what they may do: sign-in with an API token, a session
cookie, CSRF tokens for actions.

With `DL_API_TOKENS` set, a viewer signs in with a token once; the session cookie then carries
the token's name (never the token), its scope and an expiry. It is HttpOnly and
SameSite=Strict. Without tokens the API's rule holds (the service serves on a loopback address
unless DL_ALLOW_UNAUTHENTICATED): every viewer is `admin`, with a session of its own all the
same, for CSRF.

Sessions are signed with a key every replica shares, and that outlives restarts: derived from
the deployment's secret (DL_SESSION_SECRET, or the one kept in the database) and the configured
tokens' digests, so that any replica behind a shared port or a load balancer accepts a session
another one opened, a restart ends none, and changing the tokens ends every session.

Every action (a POST) carries a CSRF token, the HMAC of its session; a request from another
site is refused before it reaches the dashboard (`api.origins`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from dataloader.api.auth import Authenticator
from dataloader.config import Scope

#: The session cookie's name.
COOKIE: Final = "dl_session"
#: How long a session lasts.
SESSION_SEC: Final = 12 * 3600
#: The form field (and htmx header) carrying the CSRF token.
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "X-CSRF-Token"
#: Who acted, in the journal and audit logs, for a viewer without a token.
DASHBOARD_ACTOR: Final = "dashboard"


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: the token's name (None without authentication), its scope, and the
    session's CSRF token."""

    name: str | None
    scope: Scope
    csrf: str

    @property
    def actor(self) -> str:
        """Who the journal and audit logs say acted: the token's name as the API says it,
        or, without tokens, `dashboard` (not the API's `api`: it tells the two apart)."""
        return DASHBOARD_ACTOR if self.name is None else f"token:{self.name}"

    def may(self, scope: Scope) -> bool:
        return self.scope >= scope


class StaleSession(Exception):
    """An action the session cannot vouch for (no session, or a CSRF token of another one):
    refused, and the viewer is told to reload the page (`message`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Sessions:
    """Signs and reads session cookies for `authenticator`'s tokens."""

    def __init__(self, authenticator: Authenticator, secret: Callable[[], bytes]) -> None:
        """`secret()`: the deployment's shared secret, asked for at the first use (it is read
        from the database once the service has opened it)."""
        self._authenticator = authenticator
        self._secret = secret
        self._key: bytes | None = None

    @property
    def _signing_key(self) -> bytes:
        if self._key is None:
            material = self._secret() + b"\0" + self._authenticator.key_material
            self._key = hashlib.sha256(b"dataloader-dashboard\0" + material).digest()
        return self._key

    @property
    def required(self) -> bool:
        """Whether a viewer must sign in (tokens are configured)."""
        return self._authenticator.enabled

    def sign_in(self, presented: str) -> str | None:
        """The cookie value for a session of the token `presented` (None: no such token)."""
        token = self._authenticator.identify(presented.strip())
        if token is None:
            return None
        return self._sign({"name": token.name, "exp": int(time.time()) + SESSION_SEC})

    def anonymous(self) -> str:
        """The cookie value of a session without authentication."""
        return self._sign(
            {"name": None, "exp": int(time.time()) + SESSION_SEC, "n": secrets.token_hex(8)}
        )

    def viewer(self, cookie: str | None) -> Viewer | None:
        """Who holds the session `cookie` (None: none, forged, expired, or its token gone)."""
        claims = self._verify(cookie)
        if claims is None:
            return None
        csrf = self._mac(b"csrf\0" + (cookie or "").encode())
        name = claims.get("name")
        if name is None:
            return None if self.required else Viewer(None, Scope.admin, csrf)
        token = self._authenticator.named(str(name))
        return None if token is None else Viewer(token.name, token.scope, csrf)

    def check_action(self, viewer: Viewer, presented: str | None) -> None:
        """StaleSession unless the action carries the session's CSRF token (a request from
        another site never gets here: `api.origins`)."""
        if presented is None or not hmac.compare_digest(presented, viewer.csrf):
            raise StaleSession(
                "This action was not made from a page of your session (it ended, or the page"
                " was opened before it began): nothing was changed. Reload the page and try"
                " again."
            )

    def _sign(self, claims: dict[str, object]) -> str:
        body = base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode())
        return f"{body.decode()}.{self._mac(body)}"

    def _verify(self, cookie: str | None) -> dict[str, object] | None:
        if not cookie or "." not in cookie:
            return None
        body, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac, self._mac(body.encode())):
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(body))
        except ValueError:
            return None
        if not isinstance(claims, dict) or int(claims.get("exp", 0)) < time.time():
            return None
        return claims

    def _mac(self, data: bytes) -> str:
        return hmac.new(self._signing_key, data, hashlib.sha256).hexdigest()
