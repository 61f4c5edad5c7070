-- What operators set on a queue, and what it did recently.

-- A queue's settings, one row per queue an operator ever set something on. A paused queue is
-- claimed by no worker of any replica (its running jobs finish); `changed_by` names who
-- paused or resumed it last.
CREATE TABLE IF NOT EXISTS dl_queues (
    queue text PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text NOT NULL
);

-- Who did what to a queue (paused, resumed …), newest last: the queue's audit log.
CREATE TABLE IF NOT EXISTS dl_queue_events (
    event_id bigserial PRIMARY KEY,
    queue text NOT NULL,
    ts timestamptz NOT NULL DEFAULT now(),
    kind text NOT NULL,
    actor text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS ix_dl_queue_events_queue ON dl_queue_events (queue, event_id);

-- How many attempts each queue's workers ended, by the journal kind of the end (done, failed,
-- requeue, canceled …), per 10-second bucket. Each process adds its own counts at its presence
-- refresh, so no row is written per job and replicas seldom meet on a row. Read for the
-- throughput over the last 1, 5 and 60 minutes; buckets older than a day are deleted.
CREATE TABLE IF NOT EXISTS dl_queue_throughput (
    queue text NOT NULL,
    bucket timestamptz NOT NULL,
    kind text NOT NULL,
    n bigint NOT NULL CHECK (n >= 0),
    PRIMARY KEY (queue, bucket, kind)
);
