-- A runbook's `demote_after`: failed runs of it, whichever replica ran
-- them, and the demotions they reached. A demotion holds on every replica
-- until a person promotes the runbook again (runwarden_promote), which
-- forgets its failures so the count starts again.
CREATE TABLE runwarden_failures (
    run_id     text PRIMARY KEY,
    runbook    text NOT NULL,
    failed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    evidence   jsonb NOT NULL
);
CREATE INDEX runwarden_failures_runbook ON runwarden_failures (runbook, failed_at);

CREATE TABLE runwarden_demotions (
    runbook    text PRIMARY KEY,
    demotion   jsonb NOT NULL,
    last_at    timestamptz NOT NULL,
    per_ms     bigint NOT NULL
);

-- Record one failed run; the demotion (as JSON) when this failure reached
-- it, else NULL. Replicas recording failures of one runbook at once take
-- turns (an advisory lock on the runbook), so exactly one demotes.
CREATE FUNCTION runwarden_record_failure(
    p_run_id text, p_runbook text, p_evidence jsonb,
    p_failures integer, p_per_ms bigint, p_replica text, p_keep_ms bigint)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    found jsonb;
    n integer;
    d jsonb;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('runwarden_demotion'), hashtext(p_runbook));
    DELETE FROM runwarden_failures WHERE failed_at < now_ - p_keep_ms * interval '1 millisecond';
    INSERT INTO runwarden_failures (run_id, runbook, failed_at, evidence)
        VALUES (p_run_id, p_runbook, now_, p_evidence) ON CONFLICT (run_id) DO NOTHING;
    IF EXISTS (SELECT 1 FROM runwarden_demotions WHERE runbook = p_runbook) THEN
        RETURN NULL;
    END IF;
    SELECT count(*), coalesce(jsonb_agg(evidence ORDER BY failed_at), '[]'::jsonb) INTO n, found
        FROM runwarden_failures
        WHERE runbook = p_runbook AND failed_at > now_ - p_per_ms * interval '1 millisecond';
    IF n < p_failures THEN
        RETURN NULL;
    END IF;
    d := jsonb_build_object(
        'runbook', p_runbook,
        'since', to_char(now_ AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'by', p_replica,
        'failures', p_failures,
        'per_secs', p_per_ms / 1000,
        'evidence', found);
    INSERT INTO runwarden_demotions (runbook, demotion, last_at, per_ms)
        VALUES (p_runbook, d, now_, p_per_ms);
    PERFORM pg_notify('runwarden_demotion', p_runbook);
    RETURN d;
END $$;

-- A person restores a runbook's standing approval. 'not_demoted', or
-- 'window' (with when the evidence leaves its window) unless p_force, or
-- 'promoted' with the demotion it lifted.
CREATE FUNCTION runwarden_promote(p_runbook text, p_force boolean,
    OUT result text, OUT demotion jsonb, OUT window_ends timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    r runwarden_demotions;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('runwarden_demotion'), hashtext(p_runbook));
    SELECT * INTO r FROM runwarden_demotions WHERE runbook = p_runbook;
    IF NOT FOUND THEN
        result := 'not_demoted';
        RETURN;
    END IF;
    demotion := r.demotion;
    window_ends := r.last_at + r.per_ms * interval '1 millisecond';
    IF NOT p_force AND window_ends > clock_timestamp() THEN
        result := 'window';
        RETURN;
    END IF;
    DELETE FROM runwarden_demotions WHERE runbook = p_runbook;
    DELETE FROM runwarden_failures WHERE runbook = p_runbook;
    PERFORM pg_notify('runwarden_demotion', p_runbook);
    result := 'promoted';
END $$;

INSERT INTO runwarden_schema (version) VALUES (9);
