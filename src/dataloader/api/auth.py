"""Bearer-token authentication of the API (`DL_API_TOKENS`).

Each route declares the scope it needs (`requires(Scope.read)` …) and is checked by
`AuthorizedRoute` before its body is parsed; a token's scope includes the lower ones. Presented
tokens are compared by their SHA-256 digests with `hmac.compare_digest`, against every
configured token without stopping at a match, so neither the answer's timing nor its content
tells how much of a guess was right. Tokens never reach a log line: failures are logged with
the reason and the path, successes not at all.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer

from dataloader.api.origins import check_json_body
from dataloader.api.parameters import Admission, CheckedRoute, check_parameters
from dataloader.config import ApiToken, Scope

log = logging.getLogger(__name__)

#: Who a request is recorded as made by when authentication is off.
UNAUTHENTICATED_ACTOR = "api"

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

    def named(self, name: str) -> ApiToken | None:
        """The configured token called `name`, if any."""
        return next((token for _, token in self._tokens if token.name == name), None)

    @property
    def key_material(self) -> bytes:
        """What every replica with the same tokens shares, and nobody without them knows: the
        tokens' digests (empty without tokens)."""
        return b"".join(digest for digest, _ in self._tokens)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class _Requirement(HTTPBearer):
    """The dependency `requires` returns. As a bearer scheme it declares itself in the OpenAPI
    schema (one dependency per request, where a requirement depending on `HTTPBearer` would be
    two); `AuthorizedRoute` checks it before the body is parsed, and the dependency checks it
    again when it runs, so that a route of another class (or a router-level requirement,
    which the route class does not see) fails closed rather than open."""

    def __init__(self, scope: Scope) -> None:
        # `auto_error=False`: a missing token is our 401, not FastAPI's
        super().__init__(
            scheme_name="HTTPBearer",
            description="A token of DL_API_TOKENS (when authentication is on).",
            auto_error=False,
        )
        self.scope = scope

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        authorize(request, self.scope)


def requires(scope: Scope) -> Any:
    """A route dependency: the request needs a token of at least `scope` (on routers whose
    `route_class` is `AuthorizedRoute`)."""
    return Depends(_Requirement(scope))


class AuthorizedRoute(CheckedRoute):
    """A route of the API that checks the token its `requires` asks for first of all (a
    request without the right token learns nothing, not even whether its body would have
    been valid), then that a change comes as JSON or without a body (`check_json_body`), then
    its parameters (`CheckedRoute`)."""

    def admission(self) -> Admission:
        needed = [
            d.dependency.scope for d in self.dependencies if isinstance(d.dependency, _Requirement)
        ]
        scope = max(needed) if needed else None

        def authorized(request: Request) -> None:
            if scope is not None:
                authorize(request, scope)
            check_json_body(request)
            check_parameters(request)

        return authorized


def authorize(request: Request, scope: Scope) -> None:
    """Raise 401 (no or unknown token) or 403 (too small a scope) unless authentication is
    off or the request's bearer token has at least `scope`."""
    authenticator: Authenticator = request.app.state.authenticator
    if not authenticator.enabled:
        request.state.actor = UNAUTHENTICATED_ACTOR
        return
    presented = _bearer_token(request)
    token = authenticator.identify(presented) if presented else None
    if token is None:
        reason = "unknown bearer token" if presented else "missing bearer token"
        log.warning("refused %s %s: %s", request.method, request.url.path, reason)
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
    request.state.actor = f"token:{token.name}"


def request_actor(request: Request) -> str:
    """Who makes the request, as the journal and audit logs record it: `token:<name>` of its
    bearer token, or `api` when authentication is off."""
    return getattr(request.state, "actor", UNAUTHENTICATED_ACTOR)


async def actor_of(request: Request) -> str:
    """`request_actor`, as a dependency."""
    return request_actor(request)


#: A route's dependency: who makes the request (see `actor_of`).
Actor = Annotated[str, Depends(actor_of)]


def _bearer_token(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()
