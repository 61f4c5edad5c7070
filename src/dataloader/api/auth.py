"""Bearer-token authentication of the API (`DL_API_TOKENS`).

Each route declares the scope it needs (`requires(Scope.read)` …); a token's scope includes the
lower ones. Presented tokens are compared by their SHA-256 digests with `hmac.compare_digest`,
against every configured token without stopping at a match, so neither the answer's timing nor
its content tells how much of a guess was right. Tokens never reach a log line: failures are
logged with the reason and the client's address, successes not at all.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dataloader.config import ApiToken, Scope

log = logging.getLogger(__name__)

#: Declared in the OpenAPI schema; `auto_error=False` so that a missing token is our 401.
_bearer = HTTPBearer(
    auto_error=False, description="A token of DL_API_TOKENS (when authentication is on)."
)

#: 401/403 answers for the OpenAPI schema of protected routes.
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or unknown bearer token"},
    403: {"description": "The token's scope does not allow this"},
}


class Authenticator:
    """The configured tokens, by digest; no tokens means authentication is off."""

    def __init__(self, tokens: list[ApiToken]) -> None:
        self._tokens = [(_digest(t.token.get_secret_value()), t) for t in tokens]

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def identify(self, presented: str) -> ApiToken | None:
        """The token `presented` matches, if any (constant time in what it matches)."""
        digest = _digest(presented)
        found = None
        for known, token in self._tokens:
            if hmac.compare_digest(known, digest):
                found = token
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def requires(scope: Scope) -> Any:
    """A route dependency that lets a request through with a token of at least `scope`."""

    async def check(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        authenticator: Authenticator = request.app.state.authenticator
        if not authenticator.enabled:
            return
        token = authenticator.identify(credentials.credentials) if credentials else None
        if token is None:
            reason = "unknown bearer token" if credentials else "missing bearer token"
            log.warning(
                "refused %s %s: %s",
                request.method,
                request.url.path,
                reason,
                extra={"client": request.client.host if request.client else None},
            )
            raise HTTPException(401, reason, headers={"WWW-Authenticate": "Bearer"})
        if token.scope < scope:
            log.warning(
                "refused %s %s: token %r has scope %s, %s needed",
                request.method,
                request.url.path,
                token.name,
                token.scope.name,
                scope.name,
            )
            raise HTTPException(
                403, f"this token's scope is {token.scope.name}; {scope.name} is needed"
            )

    return Depends(check)
