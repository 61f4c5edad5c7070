-- A job inserted with a later available_at by other means than dataloader's client (plain SQL,
-- another service sharing the table, an older version) is written parked, as the client writes
-- it: otherwise the first claim that walks past it parks it, a full update of the row and of
-- its indexes inside the drain of the jobs that can run (50,000 such rows cost the drain a
-- third of its rate). The trigger's condition is evaluated without calling the function, so
-- an insert of a job that is due, or already parked, pays only that test.
CREATE OR REPLACE FUNCTION dl_park_delayed_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.parked := 'delayed';
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS dl_jobs_park_delayed_insert ON dl_jobs;
CREATE TRIGGER dl_jobs_park_delayed_insert
BEFORE INSERT ON dl_jobs
FOR EACH ROW
WHEN (NEW.status = 'queued' AND NEW.parked IS NULL AND NEW.available_at > now())
EXECUTE FUNCTION dl_park_delayed_insert();
