-- A whole notification's triggers in one round trip: each decided as
-- runwarden_admit decides one, in the order given, in one transaction.
-- Callers send them sorted by (runbook, host), so two replicas deciding
-- overlapping notifications lock rows in the same order and never deadlock.
-- `p_keys` holds each trigger's keys as a JSON array (arrays of arrays
-- must be rectangular).
CREATE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[])
RETURNS TABLE (n integer, outcome text, token bigint)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_runbooks, 1), 0) LOOP
        n := i;
        SELECT a.outcome, a.token INTO outcome, token
            FROM runwarden_admit(p_runbooks[i], p_hosts[i],
                                 ARRAY(SELECT jsonb_array_elements_text(p_keys[i]::jsonb)),
                                 p_cooldowns_ms[i], p_run_ids[i], p_replica, p_lease_ms,
                                 p_triggers[i]) a;
        RETURN NEXT;
    END LOOP;
END $$;

INSERT INTO runwarden_schema (version) VALUES (4);
