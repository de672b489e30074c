-- Sessions get what E2B-style clients manage them by: metadata (a JSON
-- object of strings, bounded by the session package, filterable in lists),
-- a lifetime (expires_at, unix milliseconds; 0: none, as before), what
-- happens when it ends (on_expiry: '' or 'destroy', or 'pause') and whether
-- the session is paused (paused: set by a pause, cleared by a resume or a
-- use; it outlives the frozen box, which a restart ends). The server ends
-- expired sessions by expires_at; the partial index keeps finding them
-- cheap however many sessions have no lifetime.
ALTER TABLE sessions ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN expires_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN on_expiry TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sessions_expiry ON sessions (expires_at) WHERE expires_at > 0;
