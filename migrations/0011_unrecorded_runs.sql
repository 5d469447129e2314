-- A run the fleet admitted is only as safe as the replica that admitted it:
-- until that replica has the trigger on its own disk, it may die, its
-- sender hears no 2xx and sends again, perhaps to another replica. That
-- retry must not be told "deduplicated" by the very run it is retrying, or
-- the trigger is lost until the sender's next repeat. So a run starts
-- `recorded = false` (when its replica says it will confirm), the replica
-- confirms it once its disk has the trigger (`runwarden_recorded`), and a
-- trigger for a host held by an unconfirmed run is answered `pending`: the
-- replica asks again for a moment, then tells its sender to retry. By then
-- the run is confirmed (a true duplicate), or its lease ran out or the
-- queue's reaper removed it, and the retry starts a run. A run closed
-- unconfirmed never ran: it is `not_started`, and neither a cooldown nor a
-- runbook's `max_runs` counts it (nor one still unconfirmed, which holds
-- its host while its lease lasts and never ran once the lease is gone).
--
-- The mark is the run's, not its lease's: confirming touches only this
-- replica's own runs' rows, never a lease row another replica's admission
-- holds, so a confirmation and an admission never wait on each other.
ALTER TABLE runwarden_runs ADD COLUMN recorded boolean NOT NULL DEFAULT true;

CREATE FUNCTION runwarden_admit(
    p_runbook text, p_host text, p_keys text[], p_cooldown_ms bigint,
    p_run_id text, p_replica text, p_lease_ms bigint, p_trigger text,
    p_window_ms bigint, p_cap_count integer, p_cap_ms bigint, p_request jsonb,
    p_confirm boolean,
    OUT outcome text, OUT token bigint, OUT ago_ms bigint, OUT queued boolean)
LANGUAGE plpgsql AS $$
DECLARE
    l runwarden_leases;
    now_ timestamptz := clock_timestamp();
BEGIN
    queued := false;
    INSERT INTO runwarden_leases (runbook, host) VALUES (p_runbook, p_host)
        ON CONFLICT DO NOTHING;
    SELECT * INTO l FROM runwarden_leases
        WHERE runbook = p_runbook AND host = p_host FOR UPDATE;
    ago_ms := (extract(epoch FROM now_ - l.ended_at) * 1000)::bigint;
    IF EXISTS (SELECT 1 FROM runwarden_kill_switch
               WHERE scope IN ('global', p_runbook) AND (until IS NULL OR until > now_)) THEN
        outcome := 'kill_switch';
    ELSIF l.expires_at IS NOT NULL AND l.expires_at > now_
            AND (EXISTS (SELECT 1 FROM runwarden_runs r
                         WHERE r.run_id = l.run_id AND NOT r.recorded)
                 OR EXISTS (SELECT 1 FROM runwarden_queue q
                            WHERE q.run_id = l.run_id AND NOT q.ready)) THEN
        -- Held by a run whose trigger no replica has on disk yet (a queue
        -- row not ready is the previous version's way of saying so).
        outcome := 'pending';
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
                   AND recorded AND status <> 'not_started'
                   AND started_at > now_ - p_cap_ms * interval '1 millisecond') >= p_cap_count THEN
        outcome := 'capped';
    ELSE
        outcome := 'started';
        token := l.token + 1;
        queued := p_request IS NOT NULL;
        UPDATE runwarden_leases
            SET token = l.token + 1, run_id = p_run_id,
                replica = CASE WHEN queued THEN NULL ELSE p_replica END,
                expires_at = CASE WHEN queued THEN 'infinity'::timestamptz
                                  ELSE now_ + p_lease_ms * interval '1 millisecond' END,
                keys = p_keys
            WHERE runbook = p_runbook AND host = p_host;
        INSERT INTO runwarden_runs (run_id, runbook, host, replica, token, status, recorded)
            VALUES (p_run_id, p_runbook, p_host, p_replica, l.token + 1,
                    CASE WHEN queued THEN 'queued' ELSE 'running' END, NOT p_confirm);
        IF queued THEN
            INSERT INTO runwarden_queue (run_id, runbook, host, request, queued_by)
                VALUES (p_run_id, p_runbook, p_host, p_request, p_replica);
        END IF;
    END IF;
    -- A pending trigger is asked again, or recorded by its replica when it
    -- gives up: one row per trigger, not one per attempt.
    IF outcome <> 'pending' THEN
        INSERT INTO runwarden_triggers (replica, runbook, host, trigger, keys, outcome, run_id)
            VALUES (p_replica, p_runbook, p_host, p_trigger, p_keys, outcome,
                    CASE WHEN outcome = 'started' THEN p_run_id END);
    END IF;
END $$;

-- A notification's triggers, as version 10 decides them; with `p_confirm`
-- the runs it starts wait for `runwarden_recorded`.
CREATE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint, p_cap_counts integer[], p_caps_ms bigint[],
    p_requests text[], p_direct integer, p_fire text, p_confirm boolean)
RETURNS TABLE (n integer, outcome text, token bigint, queued boolean)
LANGUAGE plpgsql AS $$
DECLARE
    claimed integer := 0;
BEGIN
    IF p_fire IS NOT NULL THEN
        INSERT INTO runwarden_fires (fire) VALUES (p_fire) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            FOR i IN 1 .. coalesce(array_length(p_runbooks, 1), 0) LOOP
                n := i;
                outcome := 'deduplicated';
                token := NULL;
                queued := false;
                RETURN NEXT;
            END LOOP;
            RETURN;
        END IF;
        DELETE FROM runwarden_fires WHERE at < clock_timestamp() - interval '1 day';
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_runbooks, 1), 0) LOOP
        n := i;
        SELECT a.outcome, a.token, a.queued INTO outcome, token, queued
            FROM runwarden_admit(p_runbooks[i], p_hosts[i],
                                 ARRAY(SELECT jsonb_array_elements_text(p_keys[i]::jsonb)),
                                 p_cooldowns_ms[i], p_run_ids[i], p_replica, p_lease_ms,
                                 p_triggers[i], p_window_ms, p_cap_counts[i], p_caps_ms[i],
                                 CASE WHEN p_direct IS NULL OR claimed < p_direct THEN NULL
                                      ELSE p_requests[i]::jsonb END,
                                 p_confirm) a;
        IF outcome = 'started' AND NOT queued THEN
            claimed := claimed + 1;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- The previous versions' forms: nothing waits for a confirmation they
-- never send.
CREATE OR REPLACE FUNCTION runwarden_admit(
    p_runbook text, p_host text, p_keys text[], p_cooldown_ms bigint,
    p_run_id text, p_replica text, p_lease_ms bigint, p_trigger text,
    p_window_ms bigint, p_cap_count integer, p_cap_ms bigint, p_request jsonb,
    OUT outcome text, OUT token bigint, OUT ago_ms bigint, OUT queued boolean)
LANGUAGE sql AS $$
    SELECT a.outcome, a.token, a.ago_ms, a.queued
    FROM runwarden_admit(p_runbook, p_host, p_keys, p_cooldown_ms, p_run_id, p_replica,
                         p_lease_ms, p_trigger, p_window_ms, p_cap_count, p_cap_ms,
                         p_request, false) a
$$;

CREATE OR REPLACE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint, p_cap_counts integer[], p_caps_ms bigint[],
    p_requests text[], p_direct integer, p_fire text)
RETURNS TABLE (n integer, outcome text, token bigint, queued boolean)
LANGUAGE sql AS $$
    SELECT * FROM runwarden_admit_all(p_runbooks, p_hosts, p_keys, p_cooldowns_ms,
        p_run_ids, p_replica, p_lease_ms, p_triggers, p_window_ms, p_cap_counts, p_caps_ms,
        p_requests, p_direct, p_fire, false)
$$;

CREATE OR REPLACE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint, p_cap_counts integer[], p_caps_ms bigint[],
    p_requests text[], p_direct integer)
RETURNS TABLE (n integer, outcome text, token bigint, queued boolean)
LANGUAGE sql AS $$
    SELECT * FROM runwarden_admit_all(p_runbooks, p_hosts, p_keys, p_cooldowns_ms,
        p_run_ids, p_replica, p_lease_ms, p_triggers, p_window_ms, p_cap_counts, p_caps_ms,
        p_requests, p_direct, NULL, false)
$$;

-- The admitting replica has these runs' triggers on disk: each run is
-- confirmed (a retry of its trigger is now a duplicate), and those queued
-- may be taken. Returns how many queued runs still waited (one the reaper
-- removed meanwhile is not).
CREATE FUNCTION runwarden_recorded(p_run_ids text[], p_queued text[]) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runwarden_runs SET recorded = true
        WHERE run_id = ANY(p_run_ids) AND NOT recorded;
    RETURN CASE WHEN cardinality(p_queued) > 0 THEN runwarden_ready(p_queued) ELSE 0 END;
END $$;

-- A run that proves its lease for a call is about to make it: from then on
-- it counts as a run that ran (for the reaper, a cooldown and `max_runs`),
-- whatever became of its confirmation, so a change is never left out of
-- them. As version 1's, but for that mark.
CREATE OR REPLACE FUNCTION runwarden_fence(
    p_runbook text, p_host text, p_run_id text, p_token bigint, p_lease_ms bigint,
    p_replica text, p_mutating boolean,
    p_scopes text[], p_limits bigint[], p_windows_ms bigint[], p_keep_ms bigint,
    OUT verdict text, OUT detail text)
LANGUAGE plpgsql AS $$
DECLARE
    l runwarden_leases;
    k runwarden_kill_switch;
    used bigint;
    now_ timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO l FROM runwarden_leases
        WHERE runbook = p_runbook AND host = p_host FOR UPDATE;
    IF NOT FOUND OR l.token <> p_token OR l.run_id IS DISTINCT FROM p_run_id THEN
        verdict := 'lease_lost';
        detail := format('another claim (token %s, replica %s) has taken over this run''s lease (token %s)',
                         l.token, coalesce(l.replica, 'none'), p_token);
        RETURN;
    END IF;
    IF l.expires_at IS NULL OR l.expires_at <= now_ THEN
        verdict := 'lease_lost';
        detail := format('the lease (token %s) expired %s ago without renewal', p_token,
                         coalesce((now_ - l.expires_at)::text, 'some time'));
        RETURN;
    END IF;
    SELECT * INTO k FROM runwarden_kill_switch WHERE scope IN ('global', p_runbook)
        ORDER BY scope = 'global' DESC LIMIT 1;
    IF FOUND THEN
        verdict := 'kill_switch';
        detail := format('kill switch engaged for the fleet (%s) by %s at %s: %s',
                         k.scope, k.engaged_by, k.engaged_at, k.reason);
        RETURN;
    END IF;
    IF p_mutating AND coalesce(array_length(p_limits, 1), 0) > 0 THEN
        -- One counter for the fleet: two replicas never both take the last call.
        PERFORM pg_advisory_xact_lock(hashtext('runwarden_fleet_budget'));
        FOR i IN 1 .. array_length(p_limits, 1) LOOP
            SELECT count(*) INTO used FROM runwarden_fleet_calls
                WHERE at > now_ - p_windows_ms[i] * interval '1 millisecond'
                  AND (p_scopes[i] IS NULL OR runbook = p_scopes[i]);
            IF used >= p_limits[i] THEN
                verdict := 'fleet_budget';
                detail := format('%s: %s of %s tier-2 calls in the last %s are spent across the fleet',
                                 CASE WHEN p_scopes[i] IS NULL THEN 'the fleet budget of runwarden.yaml'
                                      ELSE format('runbook %s''s fleet budget', p_scopes[i]) END,
                                 used, p_limits[i], p_windows_ms[i] * interval '1 millisecond');
                RETURN;
            END IF;
        END LOOP;
        INSERT INTO runwarden_fleet_calls (runbook, replica, run_id, keep_until)
            VALUES (p_runbook, p_replica, p_run_id, now_ + p_keep_ms * interval '1 millisecond');
        DELETE FROM runwarden_fleet_calls WHERE keep_until < now_;
    END IF;
    UPDATE runwarden_leases SET expires_at = now_ + p_lease_ms * interval '1 millisecond'
        WHERE runbook = p_runbook AND host = p_host;
    UPDATE runwarden_runs SET heartbeat_at = now_, recorded = true WHERE run_id = p_run_id;
    verdict := 'ok';
END $$;

INSERT INTO runwarden_schema (version) VALUES (11);
