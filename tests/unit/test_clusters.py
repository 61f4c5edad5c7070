"""Unit tests of `dataloader.core.clusters` and of `DL_CLUSTERS` in the settings: which
cluster holds a queue or a namespace, and every refusal at start. No database."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from dataloader.clusters import check_registry, cluster_settings
from dataloader.config import load_settings
from dataloader.core import clusters as routing
from dataloader.core.clusters import DEFAULT, ClusterMap, ClusterSpec, overlap
from dataloader.exceptions import ConfigError
from dataloader.tasks import TaskRegistry

from .settings_env import clean_environment, config_error  # noqa: F401 (the fixture)

pytestmark = pytest.mark.usefixtures("clean_environment")

EU = "postgresql://dl:secret-eu@pg-eu:5432/dl"
US = "postgresql://dl:secret-us@pg-us:5432/dl"


def groups(**named: dict[str, Any]) -> str:
    return json.dumps(named)


def test_a_queue_lives_in_the_group_naming_it_or_its_prefix_else_in_the_default() -> None:
    clusters = ClusterMap(
        {
            "eu": ClusterSpec(dsn=EU, queues=["eu.*", "billing"], namespaces=["orders"]),
            "us": ClusterSpec(dsn=US, queues=["us.load"]),
        }
    )
    assert clusters.names == [DEFAULT, "eu", "us"]
    assert clusters.of_queue("eu.load") == "eu"
    assert clusters.of_queue("eu.de.x") == "eu"
    assert clusters.of_queue("billing") == "eu"
    assert clusters.of_queue("billing.2") == DEFAULT  # exact names are exact
    assert clusters.of_queue("eu") == DEFAULT  # "eu.*" holds what starts with "eu."
    assert clusters.of_queue("us.load") == "us"
    assert clusters.of_queue("etl") == DEFAULT
    assert clusters.of_namespace("orders") == "eu"
    assert clusters.of_namespace("payments") == DEFAULT
    assert clusters.split(["etl", "eu.a", "us.load", "eu.b"]) == {
        DEFAULT: ["etl"],
        "eu": ["eu.a", "eu.b"],
        "us": ["us.load"],
    }


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        ("eu.*", "eu.de", "eu.de"),
        ("eu.de", "eu.*", "eu.de"),
        ("eu.*", "eu.de.*", "eu.de."),
        ("x", "x", "x"),
        ("eu.*", "us.*", None),
        ("eu.*", "eu", None),
        ("a", "b", None),
    ],
)
def test_two_patterns_overlap_when_a_queue_matches_both(a: str, b: str, both: str | None) -> None:
    assert overlap(a, b) == both
    if both is not None:
        assert routing.matches(a, both)
        assert routing.matches(b, both)


def test_the_setting_is_read_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DL_DB_DSN", "postgresql://dl@pg-main/dl")
    monkeypatch.setenv(
        "DL_CLUSTERS", groups(eu={"dsn": EU, "queues": ["eu.*"], "namespaces": ["o"]})
    )
    settings = load_settings(_env_file=None)
    assert settings.clusters["eu"].dsn == EU
    assert settings.cluster_map.of_queue("eu.x") == "eu"
    assert load_settings(_env_file=None, clusters="").clusters == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("not json", "DL_CLUSTERS: not JSON"),
        ('["eu"]', "DL_CLUSTERS: must be a JSON object of named groups"),
        (groups(eu={"dsn": "nope", "queues": ["a"]}), "DL_CLUSTERS (item eu.dsn): must be a URL"),
        (groups(eu={"dsn": EU}), 'names no queue and no namespace: give "queues"'),
        (groups(eu={"dsn": EU, "queues": ["*"]}), "'*' alone would hold every queue"),
        (groups(eu={"dsn": EU, "queues": ["e*u"]}), "'*' may only end a pattern"),
        (groups(eu={"dsn": EU, "queues": ["a"], "size": 3}), "DL_CLUSTERS (item eu.size)"),
        (groups(default={"dsn": EU, "queues": ["a"]}), "'default' is the cluster of DL_DB_DSN"),
        (
            groups(eu={"dsn": EU, "queues": ["eu.*"]}, de={"dsn": US, "queues": ["eu.de"]}),
            "DL_CLUSTERS: queue 'eu.de' is held by cluster 'eu' ('eu.*') and by cluster 'de'",
        ),
        (
            groups(eu={"dsn": EU, "namespaces": ["o"]}, us={"dsn": US, "namespaces": ["o"]}),
            "DL_CLUSTERS: namespace 'o' is held by clusters 'eu' and 'us'",
        ),
        (
            groups(eu={"dsn": EU, "queues": ["a"]}, us={"dsn": EU, "queues": ["b"]}),
            "DL_CLUSTERS: cluster 'us' has the DSN of cluster 'eu'",
        ),
    ],
)
def test_a_setting_that_would_split_a_queue_is_refused_in_one_line(
    value: str, expected: str
) -> None:
    message = config_error(DL_CLUSTERS=value)
    assert expected in message
    assert "secret-eu" not in message
    assert "secret-us" not in message


def test_the_default_clusters_dsn_given_to_a_group_is_refused() -> None:
    message = config_error(DL_DB_DSN=EU, DL_CLUSTERS=groups(eu={"dsn": EU, "queues": ["eu.*"]}))
    assert "DL_CLUSTERS: cluster 'eu' has the DSN of cluster 'default'" in message
    assert "secret-eu" not in message


def test_shared_slots_spanning_clusters_are_refused_naming_both_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = config_error(
        DL_CLUSTERS=groups(eu={"dsn": EU, "queues": ["eu.*"]}),
        WORKERS_JSON='[{"queues": ["etl", "eu.load"], "concurrency": 2}]',
    )
    assert message.startswith("WORKERS_JSON: the shared slots of ['etl', 'eu.load'] span")
    assert "'eu.load' in cluster 'eu'" in message
    assert "DL_CLUSTERS" in message
    # shared slots within one cluster are fine
    monkeypatch.setenv("DL_CLUSTERS", groups(eu={"dsn": EU, "queues": ["eu.*"]}))
    monkeypatch.setenv("WORKERS_JSON", '[{"queues": ["eu.a", "eu.b"], "concurrency": 2}]')
    assert load_settings(_env_file=None).workers[0].queues == ["eu.a", "eu.b"]


def test_each_cluster_gets_its_own_dsn_queues_and_schedules() -> None:
    settings = load_settings(
        _env_file=None,
        db_dsn="postgresql://dl@pg-main/dl",
        db_read_dsn="postgresql://dl@pg-standby/dl",
        clusters=groups(eu={"dsn": EU, "queues": ["eu.*"]}),
        workers='[{"queue": "etl", "concurrency": 2}, {"queue": "eu.load", "concurrency": 3}]',
        cron='[{"name": "a", "schedule": "* * * * *", "task": "t", "queue": "eu.load"},'
        ' {"name": "b", "schedule": "* * * * *", "task": "t", "queue": "etl"}]',
    )
    eu = cluster_settings(settings, "eu")
    assert eu.db_dsn == EU
    assert eu.clusters == {}
    assert [w.queue for w in eu.workers] == ["eu.load"]
    assert [c.name for c in eu.cron] == ["a"]
    assert eu.db_read_dsn is None  # the standby of DL_DB_READ_DSN is the default cluster's
    default = cluster_settings(settings, DEFAULT)
    assert default.db_read_dsn == "postgresql://dl@pg-standby/dl"
    assert default.db_dsn == "postgresql://dl@pg-main/dl"
    assert [w.queue for w in default.workers] == ["etl"]
    assert [c.name for c in default.cron] == ["b"]


class Day(BaseModel):
    day: str


def test_a_stage_on_another_cluster_than_its_parent_is_refused() -> None:
    clusters = ClusterMap({"eu": ClusterSpec(dsn=EU, queues=["eu.*"])})
    registry = TaskRegistry()

    @registry.task("load", queue="etl", then=("report",))
    async def load(ctx: object) -> None: ...

    @registry.task("report", queue="eu.report")
    async def report(ctx: object) -> None: ...

    with pytest.raises(ConfigError) as raised:
        check_registry(clusters, registry)
    assert str(raised.value) == (
        "DL_CLUSTERS: task 'report', a stage (then=) of task 'load' runs on queue 'eu.report'"
        " in cluster 'eu', its parent's queue 'etl' is in cluster 'default': they must share"
        " a cluster (they change in one transaction)"
    )
    # on one cluster, the same tasks are fine
    check_registry(ClusterMap({"eu": ClusterSpec(dsn=EU, queues=["eu.*", "etl"])}), registry)


def test_a_processor_on_another_cluster_than_its_namespace_is_refused() -> None:
    registry = TaskRegistry()

    @registry.process("orders", queue="eu.orders")
    async def orders(task: object, process: object) -> None: ...

    on_queue_only = ClusterMap({"eu": ClusterSpec(dsn=EU, queues=["eu.*"])})
    with pytest.raises(ConfigError, match="the processor of namespace 'orders' runs on queue"):
        check_registry(on_queue_only, registry)
    both = ClusterMap({"eu": ClusterSpec(dsn=EU, queues=["eu.*"], namespaces=["orders"])})
    check_registry(both, registry)
    with pytest.raises(ValueError, match="in cluster 'default', its namespace is in cluster 'eu'"):
        routing.check_queue_of_namespace(both, "orders", "etl")
