-- Each session gets a host uid of its own, allocated by the store and never
-- shared: two sessions with one uid could act as each other (the in-session
-- socket names a caller by its uid, and the uid owns the workspace). Before
-- this, uids were a hash of the workspace path, and hashes collide.
--
-- SQLite cannot add a column with a UNIQUE constraint in place; the unique
-- index is that constraint (NULLs are distinct: rows of schema 2 get their
-- uid when the session manager opens, see session.Open).
ALTER TABLE sessions ADD COLUMN uid INTEGER;
CREATE UNIQUE INDEX sessions_uid ON sessions (uid);

-- The uids of destroyed sessions whose processes or files may still exist.
-- A uid stays here, reserved, until its session's boxes are gone and its
-- directory removed; only then may a new session get it.
CREATE TABLE retired_uids (
	uid        INTEGER PRIMARY KEY,
	session_id TEXT NOT NULL,
	retired_at INTEGER NOT NULL -- unix milliseconds
);

-- Sessions whose uid changed (a schema-2 uid that collided with another
-- session's) and whose directories must still be handed over to the new
-- uid. A row is removed only once the whole tree is chowned.
CREATE TABLE uid_handovers (
	session_id TEXT PRIMARY KEY,
	old_uid    INTEGER NOT NULL
);
