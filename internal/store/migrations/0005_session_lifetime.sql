-- Sessions get what E2B-style clients manage them by: metadata (a JSON
-- object of strings, bounded by the session package, filterable in lists),
-- a lifetime (expires_at, unix milliseconds; 0: none, as before) and what
-- happens when it ends (on_expiry: '' or 'destroy', or 'pause'). The server
-- ends expired sessions by expires_at; the partial index keeps finding
-- them cheap however many sessions have no lifetime.
ALTER TABLE sessions ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN expires_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN on_expiry TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_expiry ON sessions (expires_at) WHERE expires_at > 0;
