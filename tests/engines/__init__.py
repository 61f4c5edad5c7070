"""Engines the tests start themselves from Debian packages (Patroni with etcd, …)."""
