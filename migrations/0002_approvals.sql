-- L2 approval requests, shared: a request one replica opens is listed,
-- approved or denied through any replica; the replica whose run waits
-- reads the decision back within a second.
CREATE TABLE runwarden_approvals (
    id         text        PRIMARY KEY,
    replica    text        NOT NULL,   -- whose run waits
    run_id     text        NOT NULL,
    request    jsonb       NOT NULL,   -- as the API shows it
    state      jsonb       NOT NULL DEFAULT '{"state": "pending"}',
    digest     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX runwarden_approvals_pending ON runwarden_approvals (replica)
    WHERE state->>'state' = 'pending';

-- One decision, exactly once: the request must be pending, unexpired, and
-- the digest the one the approver was shown. `outcome` is `ok`,
-- `not_found`, `already_decided`, `expired` or `stale_digest`.
CREATE FUNCTION runwarden_decide(
    p_id text, p_digest text, p_approve boolean, p_by text, p_comment text,
    OUT outcome text, OUT request jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    a runwarden_approvals;
BEGIN
    SELECT * INTO a FROM runwarden_approvals WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF a.state->>'state' = 'expired' THEN
        outcome := 'expired';
        RETURN;
    END IF;
    IF a.state->>'state' <> 'pending' THEN
        outcome := 'already_decided';
        RETURN;
    END IF;
    IF a.expires_at <= clock_timestamp() THEN
        UPDATE runwarden_approvals SET state = '{"state": "expired"}' WHERE id = p_id;
        outcome := 'expired';
        RETURN;
    END IF;
    IF a.digest <> p_digest THEN
        outcome := 'stale_digest';
        RETURN;
    END IF;
    a.state := jsonb_build_object('state', CASE WHEN p_approve THEN 'approved' ELSE 'denied' END,
                                  'by', p_by, 'comment', p_comment);
    UPDATE runwarden_approvals SET state = a.state WHERE id = p_id;
    outcome := 'ok';
    request := a.request || a.state;
END $$;

INSERT INTO runwarden_schema (version) VALUES (2);
