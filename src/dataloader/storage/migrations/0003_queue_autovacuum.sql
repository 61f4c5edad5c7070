-- The queue table churns: every job is updated at least twice (claim, finish) and every update
-- leaves a dead tuple and dead index entries at the head of the claim index. Vacuum and
-- analyze it after 1 % of its rows changed (PostgreSQL's default waits for 20 % / 10 %), and
-- without throttling, so that claim cost and planner statistics stay steady. Storage
-- parameters only: the spec's columns, indexes and triggers are untouched.
ALTER TABLE dl_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- The journal is append-mostly: analyze it now and then, vacuum it for visibility maps.
ALTER TABLE dl_job_events SET (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
