-- Snapshots of session workspaces (snapshot_session, fork_session). The
-- files live under $QURO_DATA/snapshots/<id>/workspace; the row is the
-- record: its owner tenant (a snapshot is never visible to another), the
-- session it was taken of, and the settings a fork gets (env, cwd relative
-- to the workspace, network policy, rootfs). size is the bytes of its
-- files, counted against the tenant's snapshot budget. A row is made
-- before the copy (complete = 0, counted against the tenant's number of
-- snapshots) and completed after it: a server stopped mid-copy leaves an
-- incomplete snapshot its tenant sees and deletes, never files no row
-- names.
CREATE TABLE snapshots (
	id             TEXT PRIMARY KEY,
	tenant         TEXT NOT NULL,
	name           TEXT NOT NULL,
	source_session TEXT NOT NULL,
	source_name    TEXT NOT NULL,
	created_at     INTEGER NOT NULL, -- unix milliseconds
	size           INTEGER NOT NULL,
	files          INTEGER NOT NULL,
	env            TEXT NOT NULL DEFAULT '{}',
	cwd            TEXT NOT NULL DEFAULT '',
	network        TEXT NOT NULL DEFAULT 'none',
	rootfs         TEXT NOT NULL DEFAULT '',
	complete       INTEGER NOT NULL DEFAULT 0,
	UNIQUE (tenant, name)
);
