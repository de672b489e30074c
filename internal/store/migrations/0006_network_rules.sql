-- A session with network "internet" may be held to rules: a JSON object
-- {"allow": [...], "deny": [...]} of egress rules (domains, wildcards,
-- host:port, CIDRs; internal/egress.ParseRule), '' for none (the public
-- internet). set_session_network changes it with the network.
ALTER TABLE sessions ADD COLUMN net_rules TEXT NOT NULL DEFAULT '';
