-- Session names are unique per tenant, not across the service: two tenants
-- may both have a session called "default". SQLite cannot drop a UNIQUE
-- constraint in place, so the table is rebuilt.
CREATE TABLE sessions_new (
	id           TEXT PRIMARY KEY,
	name         TEXT NOT NULL,
	tenant       TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL, -- unix milliseconds
	last_used_at INTEGER NOT NULL,
	cwd          TEXT NOT NULL DEFAULT '',
	env          TEXT NOT NULL DEFAULT '{}', -- JSON object of session variables
	network      TEXT NOT NULL DEFAULT 'none',
	rootfs       TEXT NOT NULL DEFAULT '',
	UNIQUE (tenant, name)
);
INSERT INTO sessions_new SELECT id, name, tenant, created_at, last_used_at, cwd, env, network, rootfs FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_new RENAME TO sessions;

-- Bearer tokens. Only a SHA-256 of the secret part is kept: the token itself
-- is shown once, when it is created.
CREATE TABLE tokens (
	id           TEXT PRIMARY KEY, -- public part of the token, shown in lists and the audit log
	hash         TEXT NOT NULL,    -- hex SHA-256 of the secret part
	tenant       TEXT NOT NULL,
	scopes       TEXT NOT NULL,    -- comma-separated: read, exec, admin
	label        TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL, -- unix milliseconds
	last_used_at INTEGER NOT NULL DEFAULT 0,
	revoked_at   INTEGER NOT NULL DEFAULT 0
);

-- The audit log: one row per call through any access path.
CREATE TABLE audit (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	at          INTEGER NOT NULL, -- unix microseconds
	tenant      TEXT NOT NULL,
	token_id    TEXT NOT NULL,
	path        TEXT NOT NULL,    -- rest, mcp, ws, cli
	capability  TEXT NOT NULL,
	args        TEXT NOT NULL,    -- bounded summary, secrets redacted
	outcome     TEXT NOT NULL,    -- ok or an error code
	message     TEXT NOT NULL DEFAULT '', -- the error message, bounded
	duration_us INTEGER NOT NULL
);
CREATE INDEX audit_tenant_seq ON audit (tenant, seq);
