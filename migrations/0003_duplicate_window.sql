-- A repeat of a run's own trigger (the same alert fingerprint or group,
-- the same schedule fire) within 60 s of its end is a duplicate whatever
-- the cooldown: Alertmanager in HA mode sends a notification twice now and
-- then, and every replica fires the same schedule.
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
    IF l.expires_at IS NOT NULL AND l.expires_at > now_ THEN
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

INSERT INTO runwarden_schema (version) VALUES (3);
