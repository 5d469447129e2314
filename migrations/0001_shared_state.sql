-- runwarden's shared state: several daemons against one PostgreSQL.
-- Applied by `runwarden db migrate`; every daemon checks the version at start.

-- Each (runbook, host) and who holds it. `token` only grows: a claim is
-- fenced by it, so a replica whose claim was taken over can never act on
-- the old one. `expires_at` NULL: nobody holds it.
CREATE TABLE runwarden_leases (
    runbook    text        NOT NULL,
    host       text        NOT NULL,
    token      bigint      NOT NULL DEFAULT 0,
    run_id     text,
    replica    text,
    expires_at timestamptz,
    ended_at   timestamptz,          -- when its last run ended: the cooldown counts from here
    keys       text[]      NOT NULL DEFAULT '{}',  -- fingerprints and group keys of that run
    PRIMARY KEY (runbook, host)
);

-- Every run the fleet started, and how it ended.
CREATE TABLE runwarden_runs (
    run_id       text        PRIMARY KEY,
    runbook      text        NOT NULL,
    host         text        NOT NULL,
    replica      text        NOT NULL,
    token        bigint      NOT NULL,
    status       text        NOT NULL,   -- running | ended | interrupted | not_started
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at     timestamptz,
    verdict      text,
    audit_head   text,
    closed_by    text                    -- the replica that closed it, when not its own
);
CREATE INDEX runwarden_runs_running ON runwarden_runs (status) WHERE status = 'running';

-- Every trigger any replica accepted for a runbook, with its one outcome.
CREATE TABLE runwarden_triggers (
    id          bigserial   PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    replica     text        NOT NULL,
    runbook     text        NOT NULL,
    host        text        NOT NULL,
    trigger     text        NOT NULL,
    keys        text[]      NOT NULL,
    outcome     text        NOT NULL,
    run_id      text
);

-- Tier-2 calls counted against fleet budgets.
CREATE TABLE runwarden_fleet_calls (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    runbook    text        NOT NULL,
    replica    text        NOT NULL,
    run_id     text        NOT NULL,
    keep_until timestamptz NOT NULL
);
CREATE INDEX runwarden_fleet_calls_at ON runwarden_fleet_calls (at);

-- The fleet's kill switch: `global`, or one runbook.
CREATE TABLE runwarden_kill_switch (
    scope      text        PRIMARY KEY,
    engaged_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    engaged_by text        NOT NULL,
    reason     text        NOT NULL
);

-- Decide one trigger for (runbook, host) and record it, atomically: a live
-- lease deduplicates it, a run that ended within `cooldown_ms` holds it off
-- (a repeat of that run's own keys is a duplicate), otherwise it claims the
-- lease under the next token and its run is recorded as running.
CREATE FUNCTION runwarden_admit(
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

-- Before every call: prove the lease is still this run's (same token, not
-- expired) and renew it, see the fleet's kill switch, and count a tier-2
-- call against the fleet budgets, in one round trip. `verdict` is `ok`,
-- `lease_lost`, `kill_switch` or `fleet_budget`.
CREATE FUNCTION runwarden_fence(
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
    UPDATE runwarden_runs SET heartbeat_at = now_ WHERE run_id = p_run_id;
    verdict := 'ok';
END $$;

CREATE TABLE runwarden_schema (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO runwarden_schema (version) VALUES (1);
