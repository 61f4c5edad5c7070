"""Engines the tests start themselves from Debian packages: a streaming standby, Patroni
with etcd."""
