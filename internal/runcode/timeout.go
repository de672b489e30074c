package runcode

import "time"

// MillisTimeout turns a caller's timeout_ms into a duration, checking the
// milliseconds themselves: a huge value must not overflow time.Duration
// into a negative or a small one. 0 (omitted) stays 0, for the caller's
// default; anything else must lie in least..most. The error is ErrInvalid,
// with the range in milliseconds.
func MillisTimeout(ms int64, least, most time.Duration) (time.Duration, error) {
	return MillisTimeoutOf("timeout_ms", ms, least, most)
}

// MillisTimeoutOf is MillisTimeout for the input field named field (its
// name in the error).
func MillisTimeoutOf(field string, ms int64, least, most time.Duration) (time.Duration, error) {
	if ms == 0 {
		return 0, nil
	}
	lo, hi := max(least.Milliseconds(), 1), most.Milliseconds()
	if ms < lo || ms > hi {
		return 0, invalidf("%s %d is outside %d..%d (milliseconds; omit it or give 0 for the default)", field, ms, lo, hi)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
