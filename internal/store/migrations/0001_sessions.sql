-- Sessions: one row per session; the workspace lives under sessions/<id>/.
CREATE TABLE sessions (
	id           TEXT PRIMARY KEY,
	name         TEXT NOT NULL UNIQUE,
	tenant       TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL, -- unix milliseconds
	last_used_at INTEGER NOT NULL,
	cwd          TEXT NOT NULL DEFAULT '',
	env          TEXT NOT NULL DEFAULT '{}', -- JSON object of session variables
	network      TEXT NOT NULL DEFAULT 'none',
	rootfs       TEXT NOT NULL DEFAULT ''
);

-- Service-wide settings, such as which session is the default.
CREATE TABLE settings (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
