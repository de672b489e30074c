-- A session's secrets (set_session_secret): the box sees only the
-- placeholder; the egress writes the value in requests to the hosts (a
-- JSON array of domain rules). The value is sealed by the server
-- (AES-GCM with the data directory's secrets.key): never stored in the
-- clear. They go with their session.
CREATE TABLE session_secrets (
	session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
	name        TEXT NOT NULL,
	placeholder TEXT NOT NULL,
	hosts       TEXT NOT NULL,
	sealed      BLOB NOT NULL,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (session_id, name)
);
