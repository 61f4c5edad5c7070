"""Who looks at the dashboard, and what they may do: sign-in with an API token, a session
cookie, CSRF tokens for actions.

With `DL_API_TOKENS` set, a viewer signs in with a token once; the session cookie then carries
the token's name (never the token), its scope and an expiry, signed with a key derived from the
configured tokens' digests (every replica with the same tokens accepts it; changing the tokens
ends every session). It is HttpOnly and SameSite=Strict. Without tokens the API's rule holds
(the service serves on a loopback address unless DL_ALLOW_UNAUTHENTICATED): every viewer is
`admin`, with a session of its own all the same, for CSRF.

Every action (a POST) carries a CSRF token, the HMAC of its session; a request from another
site (`Sec-Fetch-Site`, or an `Origin` not this host's) is refused as well.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Final

from fastapi import HTTPException, Request

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


class Sessions:
    """Signs and reads session cookies for `authenticator`'s tokens."""

    def __init__(self, authenticator: Authenticator, key_material: bytes) -> None:
        self._authenticator = authenticator
        # from the tokens (every replica alike); without tokens, this process's own
        material = key_material or secrets.token_bytes(32)
        self._key = hashlib.sha256(b"dataloader-dashboard\0" + material).digest()

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

    def check_action(self, request: Request, viewer: Viewer, presented: str | None) -> None:
        """403 unless the action comes from this site with the session's CSRF token."""
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise HTTPException(403, "an action from another site")
        origin = request.headers.get("origin")
        if origin is not None and origin.split("://", 1)[-1] != request.headers.get("host"):
            raise HTTPException(403, "an action from another origin")
        if presented is None or not hmac.compare_digest(presented, viewer.csrf):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page")

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
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()
