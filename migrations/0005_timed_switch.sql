-- A timed kill switch: the fleet's switch may end by itself (`until`); the
-- replicas delete it once its time has come (each fence still sees it until
-- then, so it ends a few seconds late, never early). Additive: a replica of
-- the previous version ignores the column and keeps the switch until a
-- person or a newer replica removes the row.
ALTER TABLE runwarden_kill_switch ADD COLUMN until timestamptz;

-- Each replica's own switch files, as it last saw them, so that `status`
-- and `release` on any replica can say what still stops runs elsewhere.
CREATE TABLE runwarden_replica_switches (
    replica text        NOT NULL,
    scope   text        NOT NULL,
    detail  text        NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (replica, scope)
);

-- Admission sees the fleet's kill switch in the same transaction as the
-- lease: once `kill-switch engage` has returned, no replica admits a
-- trigger (its outcome is `kill_switch`, recorded), however soon after it
-- arrives and whether or not that replica has heard the notification yet.
CREATE OR REPLACE FUNCTION runwarden_admit(
    p_runbook text, p_host text, p_keys text[], p_cooldown_ms bigint,
    p_run_id text, p_replica text, p_lease_ms bigint, p_trigger text,
    OUT outcome text, OUT token bigint, OUT ago_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    l runwarden_leases;
    now_ timestamptz := clock_timestamp();
BEGIN
    INSERT INTO runwarden_leases (runbook, host) VALUES (p_runbook, p_host)
        ON CONFLICT DO NOTHING;
    SELECT * INTO l FROM runwarden_leases
        WHERE runbook = p_runbook AND host = p_host FOR UPDATE;
    ago_ms := (extract(epoch FROM now_ - l.ended_at) * 1000)::bigint;
    IF EXISTS (SELECT 1 FROM runwarden_kill_switch
               WHERE scope IN ('global', p_runbook) AND (until IS NULL OR until > now_)) THEN
        outcome := 'kill_switch';
    ELSIF l.expires_at IS NOT NULL AND l.expires_at > now_ THEN
        outcome := 'deduplicated';
        UPDATE runwarden_leases SET keys = ARRAY(SELECT DISTINCT unnest(l.keys || p_keys))
            WHERE runbook = p_runbook AND host = p_host;
    ELSIF l.ended_at IS NOT NULL AND l.keys && p_keys
            AND l.ended_at + interval '60 seconds' > now_ THEN
        outcome := 'deduplicated';
    ELSIF l.ended_at IS NOT NULL AND p_cooldown_ms IS NOT NULL
            AND l.ended_at + p_cooldown_ms * interval '1 millisecond' > now_ THEN
        outcome := CASE WHEN l.keys && p_keys THEN 'deduplicated' ELSE 'cooldown' END;
    ELSE
        outcome := 'started';
        token := l.token + 1;
        UPDATE runwarden_leases
            SET token = l.token + 1, run_id = p_run_id, replica = p_replica,
                expires_at = now_ + p_lease_ms * interval '1 millisecond', keys = p_keys
            WHERE runbook = p_runbook AND host = p_host;
        INSERT INTO runwarden_runs (run_id, runbook, host, replica, token, status)
            VALUES (p_run_id, p_runbook, p_host, p_replica, l.token + 1, 'running');
    END IF;
    INSERT INTO runwarden_triggers (replica, runbook, host, trigger, keys, outcome, run_id)
        VALUES (p_replica, p_runbook, p_host, p_trigger, p_keys, outcome,
                CASE WHEN outcome = 'started' THEN p_run_id END);
END $$;

INSERT INTO runwarden_schema (version) VALUES (5);
