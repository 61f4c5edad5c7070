"""A PostgreSQL cluster with automatic failover, as deployments run it: two nodes managed by
Patroni (Debian's `patroni`), its leader key in one etcd (Debian's `etcd-server`), PostgreSQL 15
(Debian's `postgresql-15`), in `synchronous_mode` so that a standby is promoted only if it was
synchronous and no acknowledged commit can be lost.

Everything runs on loopback, on free ports, in one temporary directory; `stop` kills every
process the cluster started (etcd, Patroni, each postmaster with its backends) and removes the
directory. Outside CI a machine without the packages skips the test with a one-line reason; in
CI (`CI=true`) it fails it.

Faults: `switchover` (planned: the leader hands over to the synchronous standby and follows it)
and `kill_primary` (a machine lost: SIGKILL of the leader's Patroni *and* its PostgreSQL;
SIGKILL of the postmaster alone is no failover, Patroni would just start it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import asyncpg
import httpx
import psutil
import pytest

from ..integration_tests.procs import free_port

PATRONI = Path("/usr/bin/patroni")
ETCD = Path("/usr/bin/etcd")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
#: Patroni's Debian package runs on the system's interpreter, with its own modules.
PACKAGES = {PATRONI: "patroni", ETCD: "etcd-server", PG_BIN / "postgres": "postgresql-15"}

SCOPE = "dataloader"
DATABASE = "faults"
#: Patroni's rule: loop_wait + 2 * retry_timeout <= ttl. A dead leader's key expires after
#: `ttl`; the standby then takes it within a loop.
TTL_SEC = 10
LOOP_WAIT_SEC = 1
RETRY_TIMEOUT_SEC = 4


def require_patroni() -> None:
    """Skip (fail in CI) when Patroni, etcd or PostgreSQL 15 is missing."""
    missing = [f"{path} ({package})" for path, package in PACKAGES.items() if not path.exists()]
    if not missing:
        return
    reason = f"the failover tests need {', '.join(missing)}: apt-get install patroni etcd-server"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass
class Node:
    """One Patroni node: its name, ports, directory and Patroni process."""

    name: str
    pg_port: int
    api_port: int
    home: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.pg_port}"

    def dsn(self, database: str = DATABASE) -> str:
        """A DSN to this node alone."""
        return f"postgresql://postgres@{self.address}/{database}"

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (its `postmaster.pid`), None if there is none."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if psutil.pid_exists(pid) else None


class PatroniCluster:
    """etcd and two Patroni nodes; use `async with PatroniCluster() as cluster:` or `start`
    and `stop` (which always leaves no process behind)."""

    def __init__(self, nodes: int = 2) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dl-patroni-"))
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.nodes = [
            Node(f"pg{n}", free_port(), free_port(), self.root / f"pg{n}") for n in range(nodes)
        ]
        self._etcd: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []
        self._http = httpx.AsyncClient(timeout=5)
        #: When `kill_primary` last killed a node (this host's clock, the database's too).
        self.killed_at: dt.datetime | None = None

    async def __aenter__(self) -> PatroniCluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- start and stop ---------------------------------------------------------------------

    async def start(self, within: float = 90) -> None:
        """Start etcd and every node; return once a leader runs with a synchronous standby
        streaming from it, and the database `DATABASE` exists."""
        require_patroni()
        postgres = pwd.getpwnam("postgres")
        os.chown(self.root, postgres.pw_uid, postgres.pw_gid)
        self._etcd = self._spawn(
            "etcd",
            [
                str(ETCD),
                "--name=etcd0",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-cluster=etcd0=http://127.0.0.1:{self.etcd_peer_port}",
                "--log-level=warn",
            ],
            as_postgres=False,
        )
        await self._wait(self._etcd_ready, within, "etcd to answer")
        for node in self.nodes:
            node.home.mkdir()
            os.chown(node.home, postgres.pw_uid, postgres.pw_gid)
            config = node.home / "patroni.json"  # JSON is YAML: Patroni reads it as its config
            config.write_text(json.dumps(self._config(node), indent=1))
            os.chown(config, postgres.pw_uid, postgres.pw_gid)
            self._start_node(node)
        await self.wait_until_replicated(within)
        leader = await self.leader()
        conn = await asyncpg.connect(leader.dsn("postgres"))
        try:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()
        # the standby has the commit on disk (synchronous), but may not have replayed it yet:
        # a DSN that tries the standby first would be told the database does not exist
        for node in self.nodes:
            await self._wait(
                lambda n=node: self._has_database(n), within, f"{DATABASE} on {node.name}"
            )

    async def _has_database(self, node: Node) -> bool:
        try:
            conn = await asyncpg.connect(node.dsn(), timeout=2)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        await conn.close()
        return True

    def _start_node(self, node: Node) -> None:
        node.proc = self._spawn(node.name, [str(PATRONI), str(node.home / "patroni.json")])

    async def stop(self) -> None:
        """Kill every process of the cluster (whatever state a failed test left it in) and
        remove its directory."""
        with contextlib.suppress(Exception):
            await self._http.aclose()
        for proc in self._processes():
            # a postmaster leads a session of its own (Patroni starts it with setsid): its
            # group holds its backends, which outlive a postmaster killed alone
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for popen in [self._etcd, *(node.proc for node in self.nodes)]:
            if popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=10)
        await asyncio.to_thread(self._wait_all_gone)
        for log in self._logs:
            log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _processes(self) -> list[psutil.Process]:
        """Every live process this cluster started: etcd, Patroni and the postmasters name the
        cluster's directory on their command line; a postmaster's children share its group."""
        root = str(self.root)
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if any(root in part for part in cmdline):
                found[proc.pid] = proc
        for node in self.nodes:
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(psutil.Error):
                    found[pid] = psutil.Process(pid)
        return list(found.values())

    def _wait_all_gone(self, within: float = 10) -> None:
        deadline = time.monotonic() + within
        while (left := self._processes()) and time.monotonic() < deadline:
            for proc in left:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            time.sleep(0.05)
        if left:
            raise AssertionError(f"processes of the cluster outlived it: {left}")

    def _spawn(
        self, name: str, argv: list[str], as_postgres: bool = True
    ) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        self._logs.append(log)
        # PostgreSQL refuses to run as root: Patroni, and so its postmaster, run as `postgres`
        user = "postgres" if as_postgres and os.geteuid() == 0 else None
        return subprocess.Popen(
            argv,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one group per process tree, killed as one
            user=user,
            group=user,
            extra_groups=[] if user else None,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(self.root)},
        )

    def _config(self, node: Node) -> dict[str, Any]:
        """Patroni's configuration of `node`: short timings, `synchronous_mode`, trust on
        loopback, a replication user."""
        return {
            "scope": SCOPE,
            "name": node.name,
            "log": {"level": "WARNING"},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": node.api[7:]},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_SEC,
                    "loop_wait": LOOP_WAIT_SEC,
                    "retry_timeout": RETRY_TIMEOUT_SEC,
                    "maximum_lag_on_failover": 1024 * 1024,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "parameters": {
                            "synchronous_commit": "on",
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "max_connections": 200,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_log_hints": "on",
                            "fsync": "off",  # a test machine: durability is the standby's
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": node.address,
                "connect_address": node.address,
                "data_dir": str(node.data_dir),
                "bin_dir": str(PG_BIN),
                "pgpass": str(node.home / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(node.home)},
            },
        }

    # --- state ------------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """The DSN an application is given: every node, writes to whichever is primary."""
        hosts = ",".join(node.address for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def node(self, name: str) -> Node:
        (node,) = [n for n in self.nodes if n.name == name]
        return node

    async def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (`GET /cluster`) from the first node that answers."""
        for node in self.nodes:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = await self._http.get(f"{node.api}/cluster", timeout=2)
                if response.status_code == 200:
                    members: list[dict[str, Any]] = response.json()["members"]
                    return members
        return []

    async def leader(self) -> Node:
        """The node Patroni names leader (fails if there is none)."""
        leaders = [m["name"] for m in await self.members() if m["role"] == "leader"]
        assert leaders, "the cluster has no leader"
        return self.node(leaders[0])

    async def _leader_if_any(self) -> Node | None:
        names = [
            m["name"]
            for m in await self.members()
            if m["role"] == "leader" and m["state"] == "running"
        ]
        return self.node(names[0]) if names else None

    async def _replicated(self) -> bool:
        """A leader that takes writes, and a synchronous standby streaming from it (in
        PostgreSQL's view, and in Patroni's: the one it may promote)."""
        leader = await self._leader_if_any()
        if leader is None or not any(m["role"] == "sync_standby" for m in await self.members()):
            return False
        try:
            conn = await asyncpg.connect(leader.dsn("postgres"), timeout=2)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        try:
            return bool(
                await conn.fetchval(
                    "SELECT NOT pg_is_in_recovery() AND EXISTS (SELECT 1 FROM"
                    " pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming')"
                )
            )
        finally:
            await conn.close()

    async def wait_until_replicated(self, within: float = 60) -> Node:
        """Wait until a leader runs with a synchronous standby streaming; the leader."""
        await self._wait(self._replicated, within, "a leader with a synchronous standby")
        return await self.leader()

    async def wait_for_new_leader(self, old: Node, within: float = 60) -> Node:
        """Wait until a node other than `old` leads and takes writes; that node."""

        async def new_leader() -> bool:
            leader = await self._leader_if_any()
            if leader is None or leader is old:
                return False
            try:
                conn = await asyncpg.connect(leader.dsn("postgres"), timeout=2)
            except (OSError, asyncpg.PostgresError, TimeoutError):
                return False
            try:
                return not await conn.fetchval("SELECT pg_is_in_recovery()")
            finally:
                await conn.close()

        await self._wait(new_leader, within, f"a leader other than {old.name}")
        return await self.leader()

    async def _etcd_ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            response = await self._http.get(f"http://127.0.0.1:{self.etcd_port}/health")
            return response.status_code == 200
        return False

    async def _wait(self, probe: Any, within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not await probe():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within}s waiting for {what}{self.logs()}")
            await asyncio.sleep(0.1)

    def logs(self) -> str:
        """The tail of every log of the cluster, for a failure's message."""
        text = ""
        for path in sorted(self.root.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-30:]
            text += f"\n--- {path.name} ---\n" + "\n".join(lines)
        return text

    # --- faults -----------------------------------------------------------------------------

    async def switchover(self, within: float = 60) -> tuple[Node, Node]:
        """A planned switchover to the synchronous standby; (old leader, new leader) once the
        new one takes writes."""
        old = await self.leader()
        (candidate,) = [n for n in self.nodes if n is not old]
        response = await self._http.post(
            f"{old.api}/switchover",
            json={"leader": old.name, "candidate": candidate.name},
            timeout=within,
        )
        assert response.status_code == 200, response.text
        return old, await self.wait_for_new_leader(old, within)

    async def kill_primary(self) -> Node:
        """A machine lost: SIGKILL the leader's Patroni and its PostgreSQL (postmaster and
        backends) at once; the killed node. Its leader key lapses after `TTL_SEC`, then the
        synchronous standby takes over (`wait_for_new_leader`)."""
        leader = await self.leader()
        assert leader.proc is not None
        postmaster = leader.postmaster_pid()
        assert postmaster is not None, f"{leader.name} runs no PostgreSQL"
        # Patroni starts the postmaster through a helper that calls setsid: the postmaster and
        # its backends share that helper's group, apart from Patroni's
        group = os.getpgid(postmaster)
        os.killpg(leader.proc.pid, signal.SIGKILL)
        os.killpg(group, signal.SIGKILL)
        self.killed_at = dt.datetime.now(dt.UTC)
        await asyncio.to_thread(leader.proc.wait, 10)
        return leader
