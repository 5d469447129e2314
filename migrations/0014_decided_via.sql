-- A decision says which door it came through (`via`: API, CLI, Slack), so
-- a chat message rewritten when a request is settled can say "approved by
-- alice via Slack". The five-argument runwarden_decide of 0002 stays for
-- replicas of the previous version during a rolling upgrade; both take
-- the request's row lock, so a decision is still made exactly once.
CREATE FUNCTION runwarden_decide(
    p_id text, p_digest text, p_approve boolean, p_by text, p_comment text, p_via text,
    OUT outcome text, OUT request jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT d.outcome, d.request INTO outcome, request
    FROM runwarden_decide(p_id, p_digest, p_approve, p_by, p_comment) d;
    IF outcome = 'ok' THEN
        UPDATE runwarden_approvals SET state = state || jsonb_build_object('via', p_via)
        WHERE id = p_id;
        request := request || jsonb_build_object('via', p_via);
    END IF;
END $$;

INSERT INTO runwarden_schema (version) VALUES (14);
