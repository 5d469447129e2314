-- A runbook's `max_runs`: at most p_cap_count runs of (runbook, host)
-- started within p_cap_ms, whichever replica started them; a trigger past
-- it is 'capped'. New overloads beside the old ones, which call them with
-- no cap: a replica of the previous version keeps deciding by its rule.
CREATE INDEX runwarden_runs_started ON runwarden_runs (runbook, host, started_at);

CREATE FUNCTION runwarden_admit(
    p_runbook text, p_host text, p_keys text[], p_cooldown_ms bigint,
    p_run_id text, p_replica text, p_lease_ms bigint, p_trigger text,
    p_window_ms bigint, p_cap_count integer, p_cap_ms bigint,
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
            AND l.ended_at + p_window_ms * interval '1 millisecond' > now_ THEN
        outcome := 'deduplicated';
    ELSIF l.ended_at IS NOT NULL AND p_cooldown_ms IS NOT NULL
            AND l.ended_at + p_cooldown_ms * interval '1 millisecond' > now_ THEN
        outcome := CASE WHEN l.keys && p_keys THEN 'deduplicated' ELSE 'cooldown' END;
    ELSIF p_cap_count IS NOT NULL
            AND (SELECT count(*) FROM runwarden_runs
                 WHERE runbook = p_runbook AND host = p_host
                   AND started_at > now_ - p_cap_ms * interval '1 millisecond') >= p_cap_count THEN
        -- The lease row is locked: replicas racing for the host count in turn.
        outcome := 'capped';
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

CREATE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint, p_cap_counts integer[], p_caps_ms bigint[])
RETURNS TABLE (n integer, outcome text, token bigint)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_runbooks, 1), 0) LOOP
        n := i;
        SELECT a.outcome, a.token INTO outcome, token
            FROM runwarden_admit(p_runbooks[i], p_hosts[i],
                                 ARRAY(SELECT jsonb_array_elements_text(p_keys[i]::jsonb)),
                                 p_cooldowns_ms[i], p_run_ids[i], p_replica, p_lease_ms,
                                 p_triggers[i], p_window_ms, p_cap_counts[i], p_caps_ms[i]) a;
        RETURN NEXT;
    END LOOP;
END $$;

-- The previous version's nine-argument forms: the same rule, no cap.
CREATE OR REPLACE FUNCTION runwarden_admit(
    p_runbook text, p_host text, p_keys text[], p_cooldown_ms bigint,
    p_run_id text, p_replica text, p_lease_ms bigint, p_trigger text,
    p_window_ms bigint,
    OUT outcome text, OUT token bigint, OUT ago_ms bigint)
LANGUAGE sql AS $$
    SELECT * FROM runwarden_admit(p_runbook, p_host, p_keys, p_cooldown_ms, p_run_id,
                                  p_replica, p_lease_ms, p_trigger, p_window_ms, NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint)
RETURNS TABLE (n integer, outcome text, token bigint)
LANGUAGE sql AS $$
    SELECT * FROM runwarden_admit_all(p_runbooks, p_hosts, p_keys, p_cooldowns_ms, p_run_ids,
                                      p_replica, p_lease_ms, p_triggers, p_window_ms,
                                      array_fill(NULL::integer, ARRAY[coalesce(array_length(p_runbooks, 1), 0)]),
                                      array_fill(NULL::bigint, ARRAY[coalesce(array_length(p_runbooks, 1), 0)]))
$$;

INSERT INTO runwarden_schema (version) VALUES (7);
