-- The egress's decisions on a session's connections (internal/app,
-- egress.go): one row per connection allowed or refused (and per name its
-- DNS refused), written in batches as they end. Bounded per session and
-- in total (the oldest pruned); dropped with the session.
CREATE TABLE egress_log (
	seq         INTEGER PRIMARY KEY,
	session     TEXT NOT NULL,
	start_us    INTEGER NOT NULL,
	dest        TEXT NOT NULL,
	addr        TEXT NOT NULL DEFAULT '',
	decision    TEXT NOT NULL,
	rule        TEXT NOT NULL DEFAULT '',
	reason      TEXT NOT NULL DEFAULT '',
	bytes_out   INTEGER NOT NULL DEFAULT 0,
	bytes_in    INTEGER NOT NULL DEFAULT 0,
	duration_us INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX egress_log_session ON egress_log (session, seq);
