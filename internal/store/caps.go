package store

import (
	"context"
	"database/sql"
	"fmt"
)

// Caps bound the sessions a new one joins, checked inside the
// transaction that adds it (CreateSession, ClaimSession), so that
// concurrent creates cannot pass a ceiling together: each counts what the
// others committed before it. Zero (or less) means no bound.
type Caps struct {
	// Tenant bounds the sessions of the new session's tenant.
	Tenant int
	// Total bounds the sessions of every tenant together, those of the
	// tenant Uncounted left out (the server's spare sessions).
	Total     int
	Uncounted string
}

// CapError is a session refused at one of its Caps: Scope "tenant" or
// "server", with the sessions counted and the bound.
type CapError struct {
	Scope         string
	Sessions, Max int
}

func (e *CapError) Error() string {
	return fmt.Sprintf("the %s is at its ceiling of %d sessions (%d)", e.Scope, e.Max, e.Sessions)
}

// checkCaps counts tenant's sessions and every tenant's against c within
// tx.
func checkCaps(ctx context.Context, tx *sql.Tx, tenant string, c *Caps) error {
	if c == nil {
		return nil
	}
	var n int
	if c.Tenant > 0 {
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM sessions WHERE tenant = ?", tenant).Scan(&n); err != nil {
			return err
		}
		if n >= c.Tenant {
			return &CapError{Scope: "tenant", Sessions: n, Max: c.Tenant}
		}
	}
	if c.Total > 0 {
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM sessions WHERE tenant != ?", c.Uncounted).Scan(&n); err != nil {
			return err
		}
		if n >= c.Total {
			return &CapError{Scope: "server", Sessions: n, Max: c.Total}
		}
	}
	return nil
}
