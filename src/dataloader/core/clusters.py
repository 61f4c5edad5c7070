"""Queues grouped onto several PostgreSQL clusters (`DL_CLUSTERS`): which cluster holds a
queue or a durable processes' namespace, and what must be refused at start because it would
split what has to live in one database. No I/O.

    DL_CLUSTERS='{"eu": {"dsn": "postgresql://dl@pg-eu/dl", "queues": ["eu.*", "billing"],
                         "namespaces": ["orders"]}}'

Each group names a cluster, its DSN, the queues it holds (an exact name, or a prefix ending
in `*`: `eu.*` holds `eu.load`, `eu.de.x`…) and the namespaces of durable processes it holds.
Every queue and namespace not routed to a group lives in the default cluster (`DL_DB_DSN`).

What has to stay in one cluster, and why:

* a queue: its jobs, its pause and limits, its audit log are rows of one database;
* the queues sharing slots (`WORKERS_JSON` `queues: […]`): one claim statement reads them;
* a task and the stages it enqueues (`then=`): a stage is written in the transaction that
  ends its parent;
* a namespace and its processor's queue: a process's state, its tasks and its timers change
  in one transaction.

A `lock_key` serialises jobs within one cluster only (an advisory lock is a cluster's): two
queues in two clusters sharing a key run their jobs side by side. That cannot be seen at start
(keys are data): it is documented (docs/scale-out.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dataloader.core import limits
from dataloader.core.dsn import normalise_dsn
from dataloader.core.processes import check_namespace
from dataloader.logger.utils import mask_dsn

#: The cluster of `DL_DB_DSN`: every queue and namespace no group names.
DEFAULT: Final = "default"
#: The setting, named by every refusal.
VARIABLE: Final = "DL_CLUSTERS"
#: What ends a queue pattern that is a prefix.
WILDCARD: Final = "*"

EXAMPLE: Final = '{"eu": {"dsn": "postgresql://…/dl", "queues": ["eu.*"], "namespaces": []}}'


def check_pattern(value: object) -> str:
    """A queue pattern: a queue's exact name, or a non-empty prefix followed by `*`."""
    text = limits.check_name(value)
    head = text.removesuffix(WILDCARD)
    if WILDCARD in head:
        raise ValueError(f"{text!r}: '*' may only end a pattern (a prefix: 'eu.*')")
    if not head:
        raise ValueError("'*' alone would hold every queue: set DL_DB_DSN to that cluster instead")
    return text


def matches(pattern: str, queue: str) -> bool:
    """Whether `pattern` holds `queue`."""
    if pattern.endswith(WILDCARD):
        return queue.startswith(pattern[:-1])
    return queue == pattern


def overlap(a: str, b: str) -> str | None:
    """A queue both patterns hold, or None when no queue is held by both."""
    a_prefix, b_prefix = a.endswith(WILDCARD), b.endswith(WILDCARD)
    if not a_prefix and not b_prefix:
        return a if a == b else None
    if a_prefix and b_prefix:
        longer = a if len(a) >= len(b) else b
        shorter = b if longer is a else a
        return longer[:-1] if longer.startswith(shorter[:-1]) else None
    exact, prefix = (b, a) if a_prefix else (a, b)
    return exact if matches(prefix, exact) else None


class ClusterSpec(BaseModel):
    """One group of `DL_CLUSTERS`: a cluster's DSN, the queues and namespaces it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dsn: str
    queues: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, value: str) -> str:
        return normalise_dsn(value)  # as DL_DB_DSN: one line, never the password

    @field_validator("queues")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return [check_pattern(pattern) for pattern in value]

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: list[str]) -> list[str]:
        return [check_namespace(name) for name in value]

    @model_validator(mode="after")
    def _holds_something(self) -> ClusterSpec:
        if not self.queues and not self.namespaces:
            raise ValueError('names no queue and no namespace: give "queues" or "namespaces"')
        return self

    @property
    def asyncpg_dsn(self) -> str:
        """The DSN without `+asyncpg`."""
        return "postgresql://" + self.dsn.split("://", 1)[1]


def parse(value: Any) -> Any:
    """`DL_CLUSTERS` as read from the environment: JSON text, an object (or nothing)."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg}); e.g. {EXAMPLE}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a JSON object of named groups, e.g. {EXAMPLE}")
    return value


def check_groups(groups: Mapping[str, ClusterSpec], default_dsn: str | None) -> None:
    """ValueError (one line) for a group named like the default or not a name, a queue held
    by two groups, a namespace in two groups, or one DSN given twice (one cluster would be
    taken for two)."""
    for name in groups:
        limits.check_name(name)
        if name == DEFAULT:
            raise ValueError(f"{DEFAULT!r} is the cluster of DL_DB_DSN: name the group otherwise")
    named = list(groups.items())
    for i, (name, spec) in enumerate(named):
        for other, other_spec in named[i + 1 :]:
            for a in spec.queues:
                for b in other_spec.queues:
                    both = overlap(a, b)
                    if both is not None:
                        raise ValueError(
                            f"queue {both!r} is held by cluster {name!r} ({a!r})"
                            f" and by cluster {other!r} ({b!r}): a queue lives in one cluster"
                        )
            shared = sorted(set(spec.namespaces) & set(other_spec.namespaces))
            if shared:
                raise ValueError(
                    f"namespace {shared[0]!r} is held by clusters {name!r} and {other!r}"
                )
    seen: dict[str, str] = {} if default_dsn is None else {default_dsn: DEFAULT}
    for name, spec in named:
        if spec.dsn in seen:
            raise ValueError(
                f"cluster {name!r} has the DSN of cluster {seen[spec.dsn]!r}"
                f" ({mask_dsn(spec.dsn)}): one cluster per group"
            )
        seen[spec.dsn] = name


@dataclass(frozen=True, slots=True)
class ClusterMap:
    """Where each queue and namespace lives: the groups of `DL_CLUSTERS` (checked by
    `check_groups`), everything else in DEFAULT."""

    groups: Mapping[str, ClusterSpec] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Every cluster, DEFAULT first, then the groups in their order."""
        return [DEFAULT, *self.groups]

    def of_queue(self, queue: str) -> str:
        """The cluster holding `queue`."""
        for name, spec in self.groups.items():
            if any(matches(pattern, queue) for pattern in spec.queues):
                return name
        return DEFAULT

    def of_namespace(self, namespace: str) -> str:
        """The cluster holding the durable processes of `namespace`."""
        for name, spec in self.groups.items():
            if namespace in spec.namespaces:
                return name
        return DEFAULT

    def split(self, queues: Iterable[str]) -> dict[str, list[str]]:
        """`queues` by the cluster holding each (clusters holding none left out)."""
        found: dict[str, list[str]] = {}
        for queue in queues:
            found.setdefault(self.of_queue(queue), []).append(queue)
        return found


def check_shared_slots(clusters: ClusterMap, shared: Iterable[Sequence[str]]) -> None:
    """ValueError naming WORKERS_JSON when one entry's shared slots (`queues: […]`) hold
    queues of two clusters: one claim statement reads them all, in one database."""
    for queues in shared:
        found = clusters.split(queues)
        if len(found) > 1:
            where = ", ".join(f"{q!r} in cluster {c!r}" for c, qs in found.items() for q in qs[:1])
            raise ValueError(
                f"WORKERS_JSON: the shared slots of {list(queues)} span clusters ({where},"
                f" {VARIABLE}): give each cluster's queues slots of their own"
            )


@dataclass(frozen=True, slots=True)
class Link:
    """Something that must live in the cluster of something else, for a refusal's words:
    a stage's queue and its parent's, a namespace and its processor's queue."""

    #: e.g. "a stage (then=) of task 'etl.load', task 'etl.report'"
    what: str
    #: The cluster it lives in, and why ("queue 'eu.report'").
    cluster: str
    where: str
    #: The cluster it must live in, and why.
    must: str
    must_where: str


def stage_links(
    clusters: ClusterMap, stages: Iterable[tuple[str, str, str | None, str | None]]
) -> list[Link]:
    """The links of stages: (parent task, stage task, parent's queue, stage's queue); a queue
    None is the job's own, unknown before it runs (nothing to check)."""
    links = []
    for parent, stage, parent_queue, stage_queue in stages:
        if parent_queue is None or stage_queue is None:
            continue
        links.append(
            Link(
                f"task {stage!r}, a stage (then=) of task {parent!r}",
                clusters.of_queue(stage_queue),
                f"queue {stage_queue!r}",
                clusters.of_queue(parent_queue),
                f"its parent's queue {parent_queue!r}",
            )
        )
    return links


def namespace_links(clusters: ClusterMap, namespaces: Mapping[str, str]) -> list[Link]:
    """The links of namespaces whose processor this process has: {namespace: its queue}."""
    return [
        Link(
            f"the processor of namespace {namespace!r}",
            clusters.of_queue(queue),
            f"queue {queue!r}",
            clusters.of_namespace(namespace),
            "its namespace",
        )
        for namespace, queue in namespaces.items()
    ]


def check_links(links: Iterable[Link]) -> None:
    """ValueError naming DL_CLUSTERS for the first link across clusters."""
    for link in links:
        if link.cluster != link.must:
            raise ValueError(
                f"{VARIABLE}: {link.what} runs on {link.where} in cluster {link.cluster!r},"
                f" {link.must_where} is in cluster {link.must!r}: they must share a cluster"
                " (they change in one transaction)"
            )


def check_queue_of_namespace(clusters: ClusterMap, namespace: str, queue: str) -> None:
    """ValueError when a process of `namespace` is started on a queue of another cluster."""
    check_links(namespace_links(clusters, {namespace: queue}))
