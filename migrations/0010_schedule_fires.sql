-- A schedule fires on every replica at once. The first replica to admit a
-- fire decides all of its hosts; the others see the fire taken and skip it
-- in one step, instead of deciding each host again behind the first one's
-- row locks. A replica whose admission of the fire is still in progress
-- holds the fire's row: the others wait for it, and if it rolls back (the
-- replica died or lost the database), the next of them admits the fire.
CREATE TABLE runwarden_fires (
    fire text PRIMARY KEY,
    at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION runwarden_admit_all(
    p_runbooks text[], p_hosts text[], p_keys text[], p_cooldowns_ms bigint[],
    p_run_ids text[], p_replica text, p_lease_ms bigint, p_triggers text[],
    p_window_ms bigint, p_cap_counts integer[], p_caps_ms bigint[],
    p_requests text[], p_direct integer, p_fire text)
RETURNS TABLE (n integer, outcome text, token bigint, queued boolean)
LANGUAGE plpgsql AS $$
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
    RETURN QUERY SELECT * FROM runwarden_admit_all(p_runbooks, p_hosts, p_keys, p_cooldowns_ms,
        p_run_ids, p_replica, p_lease_ms, p_triggers, p_window_ms, p_cap_counts, p_caps_ms,
        p_requests, p_direct);
END $$;

INSERT INTO runwarden_schema (version) VALUES (10);
