-- A token's default MCP tool profile (capability.Profile: "agent",
-- "full", ...), listed to an MCP client of that token that names none;
-- '' for the server's default.
ALTER TABLE tokens ADD COLUMN tools TEXT NOT NULL DEFAULT '';
