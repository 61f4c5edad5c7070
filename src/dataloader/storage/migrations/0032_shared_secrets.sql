-- Secrets every process of a deployment shares, made once by the first process that needs one
-- (the key that signs the dashboard's sessions, when DL_SESSION_SECRET does not give it): all
-- replicas, and every restart, use the same, so that a page opened on one is served by all.
CREATE TABLE IF NOT EXISTS dl_secrets (
    name text PRIMARY KEY,
    secret bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
