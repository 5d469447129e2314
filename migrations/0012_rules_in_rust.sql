-- The rules are runwarden's own (`src/rules/`), written once for one
-- machine and a fleet: the functions below lock, store and report facts,
-- and decide nothing. The functions of earlier migrations that decide
-- (runwarden_fence, runwarden_record_failure, runwarden_promote) stay for
-- replicas of the previous version during a rolling upgrade; these take
-- the same advisory locks, so replicas of both versions take turns.

-- Before a call: prove the run's lease (a token compared under the lease
-- row's lock; `lost` says why not, and then nothing else happens), renew
-- it, and report what the rules need: the fleet's kill switches engaged
-- for the runbook, and, for a tier-2 call under fleet budgets, how many
-- calls each window held before this one. Such a call is reserved at
-- once (`reserved`, its row), under the budgets' lock, so the answer
-- costs one round trip; a call the rules then refuse is given back
-- (runwarden_give_back). Until it is, it counts: a refusal never lets
-- another call through.
CREATE FUNCTION runwarden_prove(
    p_runbook text, p_host text, p_run_id text, p_token bigint, p_lease_ms bigint,
    p_replica text, p_mutating boolean,
    p_scopes text[], p_windows_ms bigint[], p_keep_ms bigint,
    OUT lost text, OUT switch_scopes text[], OUT switch_left_ms bigint[],
    OUT switch_details text[], OUT used bigint[], OUT reserved bigint)
LANGUAGE plpgsql AS $$
DECLARE
    l runwarden_leases;
    now_ timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO l FROM runwarden_leases
        WHERE runbook = p_runbook AND host = p_host FOR UPDATE;
    IF NOT FOUND OR l.token <> p_token OR l.run_id IS DISTINCT FROM p_run_id THEN
        lost := format('another claim (token %s, replica %s) has taken over this run''s lease (token %s)',
                       l.token, coalesce(l.replica, 'none'), p_token);
        RETURN;
    END IF;
    IF l.expires_at IS NULL OR l.expires_at <= now_ THEN
        lost := format('the lease (token %s) expired %s ago without renewal', p_token,
                       coalesce((now_ - l.expires_at)::text, 'some time'));
        RETURN;
    END IF;
    SELECT coalesce(array_agg(k.scope ORDER BY k.scope), '{}'),
           coalesce(array_agg((extract(epoch FROM k.until - now_) * 1000)::bigint ORDER BY k.scope), '{}'),
           coalesce(array_agg(format('kill switch engaged for the fleet (%s) by %s at %s: %s',
                                     k.scope, k.engaged_by, k.engaged_at, k.reason) ORDER BY k.scope), '{}')
        INTO switch_scopes, switch_left_ms, switch_details
        FROM runwarden_kill_switch k WHERE k.scope IN ('global', p_runbook);
    used := '{}';
    IF p_mutating AND coalesce(array_length(p_windows_ms, 1), 0) > 0 THEN
        -- One counter for the fleet, the lock runwarden_fence takes too.
        PERFORM pg_advisory_xact_lock(hashtext('runwarden_fleet_budget'));
        SELECT array_agg((SELECT count(*) FROM runwarden_fleet_calls
                          WHERE at > now_ - w.ms * interval '1 millisecond'
                            AND (w.scope IS NULL OR runbook = w.scope)) ORDER BY w.i)
            INTO used
            FROM unnest(p_scopes, p_windows_ms) WITH ORDINALITY AS w(scope, ms, i);
        INSERT INTO runwarden_fleet_calls (runbook, replica, run_id, keep_until)
            VALUES (p_runbook, p_replica, p_run_id, now_ + p_keep_ms * interval '1 millisecond')
            RETURNING id INTO reserved;
        DELETE FROM runwarden_fleet_calls WHERE keep_until < now_;
    END IF;
    UPDATE runwarden_leases SET expires_at = now_ + p_lease_ms * interval '1 millisecond'
        WHERE runbook = p_runbook AND host = p_host;
    UPDATE runwarden_runs SET heartbeat_at = now_, recorded = true WHERE run_id = p_run_id;
END $$;

-- A failed run of a runbook with `demote_after`, kept (once per run), and
-- the facts its rule decides on: whether the runbook is demoted already,
-- and its kept failures, oldest first, each with how long ago it happened.
-- Their evidence is read only for a demotion (runwarden_failures itself).
-- Replicas take turns per runbook, as runwarden_record_failure.
CREATE FUNCTION runwarden_failed(
    p_run_id text, p_runbook text, p_evidence jsonb, p_keep_ms bigint,
    OUT demoted boolean, OUT run_ids text[], OUT ago_ms bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('runwarden_demotion'), hashtext(p_runbook));
    DELETE FROM runwarden_failures WHERE failed_at < now_ - p_keep_ms * interval '1 millisecond';
    INSERT INTO runwarden_failures (run_id, runbook, failed_at, evidence)
        VALUES (p_run_id, p_runbook, now_, p_evidence) ON CONFLICT (run_id) DO NOTHING;
    demoted := EXISTS (SELECT 1 FROM runwarden_demotions WHERE runbook = p_runbook);
    SELECT coalesce(array_agg(f.run_id ORDER BY failed_at), '{}'),
           coalesce(array_agg((extract(epoch FROM now_ - failed_at) * 1000)::bigint ORDER BY failed_at), '{}')
        INTO run_ids, ago_ms
        FROM runwarden_failures f WHERE runbook = p_runbook;
END $$;

-- Keep a demotion the rules decided on; false when another replica's got
-- there first (exactly one is kept). Every replica hears of it.
CREATE FUNCTION runwarden_demote(p_runbook text, p_demotion jsonb, p_per_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('runwarden_demotion'), hashtext(p_runbook));
    INSERT INTO runwarden_demotions (runbook, demotion, last_at, per_ms)
        VALUES (p_runbook, p_demotion, clock_timestamp(), p_per_ms)
        ON CONFLICT (runbook) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('runwarden_demotion', p_runbook);
    RETURN true;
END $$;

-- Lift the demotion `p_demotion` (as it was read: a newer one stays) and
-- forget the runbook's failures, so the count starts again; false when it
-- is no longer there.
CREATE FUNCTION runwarden_lift(p_runbook text, p_demotion jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('runwarden_demotion'), hashtext(p_runbook));
    DELETE FROM runwarden_demotions WHERE runbook = p_runbook AND demotion = p_demotion;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM runwarden_failures WHERE runbook = p_runbook;
    PERFORM pg_notify('runwarden_demotion', p_runbook);
    RETURN true;
END $$;

INSERT INTO runwarden_schema (version) VALUES (12);
