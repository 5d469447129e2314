-- Admitted work the fleet shares. A replica claims a lease only for a run
-- it starts now (it has a free run permit); every other admitted run waits
-- here, its (runbook, host) held, until a replica with a free permit takes
-- it (`runwarden_take`, FOR UPDATE SKIP LOCKED: one taker per row). A row
-- becomes takeable (`ready`) once the replica that admitted it has the
-- trigger on its own disk; one it never marked (it died in between) is
-- removed after a lease by `runwarden_reap_queue`, freeing the host.
CREATE TABLE runwarden_queue (
    id        bigserial   PRIMARY KEY,
    run_id    text        NOT NULL UNIQUE,
    runbook   text        NOT NULL,
    host      text        NOT NULL,
    request   jsonb       NOT NULL,   -- trigger, keys, alert, dry_run, planner
    queued_by text        NOT NULL,
    queued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ready     boolean     NOT NULL DEFAULT false
);
CREATE INDEX runwarden_queue_ready ON runwarden_queue (id) WHERE ready;

-- Admission as before; a started run given `p_request` is queued instead of
-- claimed: its lease row names its run and holds the host (it never
-- expires while queued), with no replica.
CREATE FUNCTION runwarden_admit(
    p_runbook text, p_host text, p_keys text[], p_cooldown_ms bigint,
    p_run_id text, p_replica text, p_lease_ms bigint, p_trigger text,
    p_window_ms bigint, p_cap_count integer, p_cap_ms bigint, p_request jsonb,
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
        INSERT INTO runwarden_runs (run_id, runbook, host, replica, token, status)
            VALUES (p_run_id, p_runbook, p_host, p_replica, l.token + 1,
                    CASE WHEN queued THEN 'queued' ELSE 'running' END);
        IF queued THEN
            INSERT INTO runwarden_queue (run_id, runbook, host, request, queued_by)
                VALUES (p_run_id, p_runbook, p_host, p_request, p_replica);
        END IF;
    END IF;
    INSERT INTO runwarden_triggers (replica, runbook, host, trigger, keys, outcome, run_id)
        VALUES (p_replica, p_runbook, p_host, p_trigger, p_keys, outcome,
                CASE WHEN outcome = 'started' THEN p_run_id END);
END $$;

-- A notification's triggers in one transaction: the first `p_direct` that
-- start are claimed by this replica (it has that many free run permits),
-- the rest that start are queued (NULL: all claimed, the old rule).
CREATE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint, p_cap_counts integer[], p_caps_ms bigint[],
    p_requests text[], p_direct integer)
RETURNS TABLE (n integer, outcome text, token bigint, queued boolean)
LANGUAGE plpgsql AS $$
DECLARE
    claimed integer := 0;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_runbooks, 1), 0) LOOP
        n := i;
        SELECT a.outcome, a.token, a.queued INTO outcome, token, queued
            FROM runwarden_admit(p_runbooks[i], p_hosts[i],
                                 ARRAY(SELECT jsonb_array_elements_text(p_keys[i]::jsonb)),
                                 p_cooldowns_ms[i], p_run_ids[i], p_replica, p_lease_ms,
                                 p_triggers[i], p_window_ms, p_cap_counts[i], p_caps_ms[i],
                                 CASE WHEN p_direct IS NULL OR claimed < p_direct THEN NULL
                                      ELSE p_requests[i]::jsonb END) a;
        IF outcome = 'started' AND NOT queued THEN
            claimed := claimed + 1;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- The previous version's forms: every started run claimed at once.
CREATE OR REPLACE FUNCTION runwarden_admit(
    p_runbook text, p_host text, p_keys text[], p_cooldown_ms bigint,
    p_run_id text, p_replica text, p_lease_ms bigint, p_trigger text,
    p_window_ms bigint, p_cap_count integer, p_cap_ms bigint,
    OUT outcome text, OUT token bigint, OUT ago_ms bigint)
LANGUAGE sql AS $$
    SELECT a.outcome, a.token, a.ago_ms
    FROM runwarden_admit(p_runbook, p_host, p_keys, p_cooldown_ms, p_run_id, p_replica,
                         p_lease_ms, p_trigger, p_window_ms, p_cap_count, p_cap_ms, NULL) a
$$;

CREATE OR REPLACE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint, p_cap_counts integer[], p_caps_ms bigint[])
RETURNS TABLE (n integer, outcome text, token bigint)
LANGUAGE sql AS $$
    SELECT a.n, a.outcome, a.token
    FROM runwarden_admit_all(p_runbooks, p_hosts, p_keys, p_cooldowns_ms, p_run_ids,
                             p_replica, p_lease_ms, p_triggers, p_window_ms, p_cap_counts,
                             p_caps_ms, NULL, NULL) a
$$;

-- The admitting replica has the triggers on disk: their queued runs may be
-- taken. Returns how many still waited (one removed as stale is not).
CREATE FUNCTION runwarden_ready(p_run_ids text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    marked integer;
BEGIN
    UPDATE runwarden_queue SET ready = true WHERE run_id = ANY(p_run_ids);
    GET DIAGNOSTICS marked = ROW_COUNT;
    IF marked > 0 THEN
        PERFORM pg_notify('runwarden_queue', marked::text);
    END IF;
    RETURN marked;
END $$;

-- Take up to `p_limit` queued runs of the runbooks this replica knows,
-- oldest first, skipping rows another replica is taking: each becomes this
-- replica's running run under its lease.
CREATE FUNCTION runwarden_take(
    p_replica text, p_lease_ms bigint, p_limit integer, p_runbooks text[])
RETURNS TABLE (run_id text, runbook text, host text, token bigint, request jsonb,
               queued_by text)
LANGUAGE sql AS $$
    WITH picked AS (
        SELECT q.id FROM runwarden_queue q
        WHERE q.ready AND q.runbook = ANY(p_runbooks)
        ORDER BY q.id LIMIT p_limit
        FOR UPDATE SKIP LOCKED),
    taken AS (
        DELETE FROM runwarden_queue q USING picked WHERE q.id = picked.id
        RETURNING q.run_id, q.runbook, q.host, q.request, q.queued_by),
    leased AS (
        UPDATE runwarden_leases l
            SET replica = p_replica,
                expires_at = clock_timestamp() + p_lease_ms * interval '1 millisecond'
        FROM taken
        WHERE l.runbook = taken.runbook AND l.host = taken.host AND l.run_id = taken.run_id
        RETURNING l.run_id, l.token),
    running AS (
        UPDATE runwarden_runs r
            SET status = 'running', replica = p_replica, heartbeat_at = clock_timestamp()
        FROM leased WHERE r.run_id = leased.run_id
        RETURNING r.run_id)
    SELECT t.run_id, t.runbook, t.host, le.token, t.request, t.queued_by
    FROM taken t JOIN leased le ON le.run_id = t.run_id
    ORDER BY le.run_id
$$;

-- Queued runs never marked ready within `p_lease_ms` (the replica that
-- admitted them stopped before its disk had them, so their senders were
-- told to retry): removed, not started, their hosts free again.
CREATE FUNCTION runwarden_reap_queue(p_lease_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    removed integer;
BEGIN
    WITH stale AS (
        DELETE FROM runwarden_queue
        WHERE NOT ready AND queued_at < clock_timestamp() - p_lease_ms * interval '1 millisecond'
        RETURNING run_id, runbook, host),
    runs AS (
        UPDATE runwarden_runs r SET status = 'not_started', ended_at = clock_timestamp()
        FROM stale WHERE r.run_id = stale.run_id RETURNING 1)
    UPDATE runwarden_leases l SET expires_at = NULL, run_id = NULL
        FROM stale WHERE l.runbook = stale.runbook AND l.host = stale.host
                     AND l.run_id = stale.run_id;
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END $$;

INSERT INTO runwarden_schema (version) VALUES (8);
