-- Staged rollouts the fleet shares. One replica drives a rollout at a time
-- (`driver`, under a `token` that only grows, renewed before `expires_at`);
-- when it stops renewing, any replica takes it over (FOR UPDATE SKIP
-- LOCKED: one taker) and goes on from `status`, the rollout as its driver
-- last wrote it, with `runwarden_triggers` (every host a wave dispatched,
-- by its `rollout:ID` key) and `runwarden_runs` (how each ended) for what
-- came after. A person's decision taken through any replica waits in
-- `decision` until the driver applies it.
CREATE TABLE runwarden_rollouts (
    id         text        PRIMARY KEY,
    runbook    text        NOT NULL,
    fire       text        UNIQUE,       -- the schedule fire that started it, once for the fleet
    state      text        NOT NULL,     -- running | pausing | halted | aborted | finished
    status     jsonb       NOT NULL,
    driver     text        NOT NULL,
    token      bigint      NOT NULL DEFAULT 1,
    expires_at timestamptz NOT NULL,
    decision   jsonb,                    -- {"verb", "by", "reason", "replica"}: not applied yet
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One rollout of a runbook at a time, across the fleet.
CREATE UNIQUE INDEX runwarden_rollouts_one_going ON runwarden_rollouts (runbook)
    WHERE state NOT IN ('aborted', 'finished');
-- The triggers of one rollout's hosts are found by its key.
CREATE INDEX runwarden_triggers_keys ON runwarden_triggers USING gin (keys);

INSERT INTO runwarden_schema (version) VALUES (13);
