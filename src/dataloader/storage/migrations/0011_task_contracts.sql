-- Task contracts: each live process publishes what its tasks promise (queue, options, JSON
-- Schemas of args and result), {task name: contract}, beside their names. GET /api/v1/tasks
-- lists them, so that other services can validate their calls before they trigger.
ALTER TABLE dl_workers ADD COLUMN IF NOT EXISTS task_specs jsonb NOT NULL DEFAULT '{}'::jsonb;
