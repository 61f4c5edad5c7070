"""Masking of secrets before anything reaches a log line.

Masking hides values, never words: what is a value by its form (a URL's password, `key=value`,
a quoted value under a secret's key, an `Authorization` header's credentials) is hidden
whenever its key names a secret, harmless or not, since a leaked database password costs a
rotation; a sentence that only names a secret ("DL_API_TOKENS: not valid JSON") is left whole.

All patterns are linear-time on arbitrary input (anchored by look-behinds, possessive key
match): log messages can be large and attacker-influenced (paths, error texts).
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# scheme://user:password@host... — the password may contain an unencoded '@' (the last '@'
# before the host wins), but not whitespace or '/', '?', '#', which end the authority part.
_URL_PASSWORD_RE = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<prefix>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@?#]*:)"
    r"(?P<password>[^\s/?#]*)@"
)

# Values assigned to a key that names a secret: libpq `password=...`, ODBC `PWD=...`, query
# strings `?token=...`, and quoted values of reprs and JSON (`'client_secret': '...'`). The
# look-ahead finds the secret word anywhere in the key; the key itself is the whole word. Only
# what is a value by its form is masked: after `=`, or in quotes after `:`. Prose that names a
# secret ("DL_API_TOKENS: not valid JSON", "token: not set") keeps its words. An unquoted value
# ends at whitespace, a quote, '&' or ';' (query strings, ODBC), not at ',' so a password
# containing one is masked whole.
_SECRET_WORDS = r"(?:password|passwd|pwd|secret|token|api[_-]?key)"
_SECRET_KEY = rf"(?<![\w.-])(?=[\w.-]*?{_SECRET_WORDS})(?P<key>[\w.-]++)"
_QUOTED = r"\"(?:[^\"\\]|\\.)*+\"|'(?:[^'\\]|\\.)*+'"
_KV_SECRET_RE = re.compile(
    rf"{_SECRET_KEY}(?:"
    rf"(?P<sep>\s*=\s*)(?P<value>{_QUOTED}|[\"']?[^\s&;'\"]++)"
    rf"|(?P<quoted_sep>[\"']?\s*[=:]\s*)(?P<quoted>{_QUOTED}))",
    re.IGNORECASE,
)

# The credentials of an `Authorization` header (`Authorization: Bearer <token>`), in any case.
_AUTHORIZATION_RE = re.compile(
    r"(?<![\w-])(?P<head>authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+)"
    r"[A-Za-z0-9\-._~+/]++=*",
    re.IGNORECASE,
)

# Mapping keys whose values are secrets (compared lower-cased, without '-' and '_').
_SECRET_KEY_PARTS = (
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "apikey",
    "authorization",
    "cookie",
    "privatekey",
)


def _mask_url_password(match: re.Match[str]) -> str:
    return f"{match['prefix']}{MASK}@"


def _mask_kv_value(match: re.Match[str]) -> str:
    sep = match["sep"] if match["sep"] is not None else match["quoted_sep"]
    value = match["value"] if match["value"] is not None else match["quoted"]
    # keep the quotes so the masked text still reads like the original
    opening = value[0] if value[0] in "'\"" else ""
    closing = opening if len(value) > 1 and value.endswith(opening) else ""
    return f"{match['key']}{sep}{opening}{MASK}{closing}"


def mask_dsn(dsn: str) -> str:
    """Replace the password of a URL DSN (`postgresql://user:***@host/db`, any scheme) or of a
    key/value DSN (`password=***`) with `***`; a DSN without a password is returned unchanged."""
    masked = _URL_PASSWORD_RE.sub(_mask_url_password, dsn)
    return _KV_SECRET_RE.sub(_mask_kv_value, masked)


def mask_text(text: str) -> str:
    """Mask the secret values found anywhere in free text: DSN passwords, the credentials of an
    `Authorization` header, and values given to `password=`/`token=`/`secret=`-style keys
    (never the words of a sentence that names them)."""
    masked = _URL_PASSWORD_RE.sub(_mask_url_password, text)
    masked = _AUTHORIZATION_RE.sub(lambda m: f"{m['head']}{MASK}", masked)
    return _KV_SECRET_RE.sub(_mask_kv_value, masked)


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret (`password`, `api-key`, `X-Auth-Token`, ...)."""
    normalised = key.lower().replace("-", "").replace("_", "")
    return any(part in normalised for part in _SECRET_KEY_PARTS)


def mask_mapping(obj: Any) -> Any:
    """Recursively copy dicts, lists and tuples, masking secrets.

    Values under secret-looking keys become `***` (None stays None: nothing to hide), values
    under keys containing `dsn` go through `mask_dsn`, and every other string through
    `mask_text`. Other objects are returned as they are.
    """
    if isinstance(obj, str):
        return mask_text(obj)
    if isinstance(obj, dict):
        return {key: _mask_item(str(key), value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [mask_mapping(item) for item in obj]
    if isinstance(obj, tuple):
        return tuple(mask_mapping(item) for item in obj)
    return obj


def _mask_item(key: str, value: Any) -> Any:
    if value is None:
        return None
    if is_secret_key(key):
        return MASK
    if "dsn" in key.lower() and isinstance(value, str):
        # mask_dsn keeps host and database visible; mask_text would too, but say what we mean
        return mask_dsn(value)
    return mask_mapping(value)
