"""What a PostgreSQL connection string may say, and the one form dataloader's driver reads.

Users write DSNs in the two forms libpq documents: a URL (`postgresql://u@h1:5432,h2:5432/db`,
several hosts separated by commas, as Patroni, RDS and libpq users write them) and the
keyword/value form (`host=h1,h2 port=5432 dbname=db target_session_attrs=read-write`).
`normalise_dsn` checks either and returns a URL asyncpg connects with; nothing here opens a
connection.

A DSN naming several hosts is a failover setup: dataloader writes, so it must reach the one
host that takes writes. When the DSN does not say which, `target_session_attrs=read-write` is
added (libpq's default, `any`, would connect to whichever standby answers first, and every write
would then fail); a DSN that asks for a standby is refused.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

#: Accepted URL schemes; `postgresql+asyncpg://` is SQLAlchemy's spelling, the others libpq's.
URL_SCHEMES = ("postgresql+asyncpg://", "postgresql://", "postgres://")

#: The `target_session_attrs` values under which a connection may take writes.
WRITABLE_SESSION_ATTRS = frozenset({"any", "primary", "read-write"})
#: Every value asyncpg (and libpq) understands.
SESSION_ATTRS = WRITABLE_SESSION_ATTRS | {"standby", "prefer-standby", "read-only"}

#: What a DSN with several hosts gets when it names no `target_session_attrs`.
FAILOVER_SESSION_ATTRS = "read-write"

#: One `keyword = value` of the keyword/value form; a value is a bare word or single-quoted,
#: with `\'` and `\\` escapes inside quotes (libpq's rules).
_KEYWORD_VALUE_RE = re.compile(
    r"\s*(?P<key>[A-Za-z_]+)\s*=\s*(?:'(?P<quoted>(?:[^'\\]|\\.)*)'|(?P<bare>\S*))"
)


class DsnError(ValueError):
    """The DSN cannot be used; the message says why, in one line, without the password."""


def normalise_dsn(value: str, *, writes: bool = True) -> str:
    """`value` (a URL or keyword/value DSN) as a URL asyncpg accepts, `+asyncpg` kept if given.

    Every port must be a number from 0 to 65535. With several hosts and no
    `target_session_attrs`, `target_session_attrs=read-write` is added. With `writes`, a DSN
    that asks for a standby (`standby`, `prefer-standby`, `read-only`) is refused."""
    text = value.strip()
    url = text if text.startswith(URL_SCHEMES) else _url_of_keywords(text)
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    hosts = _hosts(parts.netloc, query)
    for port in _ports(parts.netloc, query):
        if port and (not port.isdigit() or int(port) > 65535):  # empty: the default port
            raise DsnError("the port must be a number from 0 to 65535")
    attrs = [v for k, v in query if k == "target_session_attrs"]
    if attrs:
        if attrs[-1] not in SESSION_ATTRS:
            known = ", ".join(sorted(SESSION_ATTRS))
            raise DsnError(f"target_session_attrs={attrs[-1]!r} is not one of {known}")
        if writes and attrs[-1] not in WRITABLE_SESSION_ATTRS:
            raise DsnError(
                f"target_session_attrs={attrs[-1]} asks for a standby, but dataloader writes to"
                " this database: use read-write (or primary)"
            )
    elif len(hosts) > 1:
        query.append(("target_session_attrs", FAILOVER_SESSION_ATTRS))
        # not `geturl()`, which drops the empty authority of `postgresql:///db?host=…`
        url = url.partition("?")[0] + "?" + urlencode(query, safe=",/:")
    return url


def _url_of_keywords(text: str) -> str:
    """The keyword/value form as a URL: user, password and dbname in their places, every other
    keyword in the query."""
    if "=" not in text:
        raise DsnError("must be a URL (postgresql://…) or keyword=value pairs (host=… dbname=…)")
    pairs: dict[str, str] = {}
    position = 0
    while position < len(text):
        if not text[position:].strip():
            break
        match = _KEYWORD_VALUE_RE.match(text, position)
        if match is None or match.end() == position:
            # the position, not the text: what follows may be part of a password
            raise DsnError(f"cannot read it from character {position + 1}: keyword=value expected")
        quoted = match["quoted"]
        pairs[match["key"]] = (
            re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else match["bare"]
        )
        position = match.end()
    credentials = quote(pairs.pop("user", ""), safe="")
    if "password" in pairs:
        credentials += ":" + quote(pairs.pop("password"), safe="")
    database = quote(pairs.pop("dbname", ""), safe="")
    query = urlencode(list(pairs.items()), safe=",/:")
    return (
        "postgresql://"
        + (f"{credentials}@" if credentials else "")
        + f"/{database}"
        + (f"?{query}" if query else "")
    )


def _hosts(netloc: str, query: list[tuple[str, str]]) -> list[str]:
    """The hosts a URL names, in its authority or in `host=` of its query."""
    hostlist = netloc.rpartition("@")[2]
    named = [h for h in hostlist.split(",") if h]
    for key, value in query:
        if key == "host":
            named = [h for h in value.split(",") if h]
    return named


def _ports(netloc: str, query: list[tuple[str, str]]) -> list[str]:
    """Every port a URL gives, in its authority (`host:port`, `[v6]:port`) or in `port=`."""
    ports = []
    for host in netloc.rpartition("@")[2].split(","):
        tail = host.rpartition("]")[2] if host.startswith("[") else host
        if ":" in tail:
            ports.append(tail.rpartition(":")[2])
    for key, value in query:
        if key == "port":
            ports.extend(value.split(","))
    return ports
