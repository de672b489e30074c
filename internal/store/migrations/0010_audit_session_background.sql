-- The audit log's session column (the session a call acted on: the one it
-- entered, or the one it created; '' for none) and its background mark (a
-- read the client made by itself, such as a page refreshing what it
-- shows: kept, and hidden from the audit view unless asked for).
ALTER TABLE audit ADD COLUMN session TEXT NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN background INTEGER NOT NULL DEFAULT 0;
