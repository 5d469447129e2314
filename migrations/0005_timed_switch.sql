-- A timed kill switch: the fleet's switch may end by itself (`until`); the
-- replicas delete it once its time has come (each fence still sees it until
-- then, so it ends a few seconds late, never early). Additive: a replica of
-- the previous version ignores the column and keeps the switch until a
-- person or a newer replica removes the row.
ALTER TABLE runwarden_kill_switch ADD COLUMN until timestamptz;

-- Each replica's own switch files, as it last saw them, so that `status`
-- and `release` on any replica can say what still stops runs elsewhere.
CREATE TABLE runwarden_replica_switches (
    replica text        NOT NULL,
    scope   text        NOT NULL,
    detail  text        NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (replica, scope)
);

INSERT INTO runwarden_schema (version) VALUES (5);
