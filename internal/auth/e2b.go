package auth

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// E2B's SDKs (the Python SDK, the JS SDK up to 2.45) refuse an API key
// that is not ^e2b_[0-9a-f]+$ unless E2B_VALIDATE_API_KEY=false. A Quro
// token quro_<id>_<secret> (id: 12 hex digits; secret: 32 random bytes,
// base64url) has a second spelling that passes that check:
// e2b_<id><the secret's 32 bytes in hex>. Both name the same token: the
// E2B form is decoded to the Quro form and then checked as any token (the
// stored hash of the secret, compared in constant time). Nothing more is
// stored.

const (
	e2bPrefix    = "e2b_"
	idHexLen     = 12 // 6 random bytes
	secretBytes  = 32
	e2bHexLength = idHexLen + 2*secretBytes
)

// E2BForm is token (quro_<id>_<secret>) in E2B's API key form.
func E2BForm(token string) (string, error) {
	id, sec, ok := strings.Cut(strings.TrimPrefix(token, prefix), "_")
	if !strings.HasPrefix(token, prefix) || !ok {
		return "", errors.New("not a Quro token (quro_<id>_<secret>)")
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(sec)
	if err != nil || len(b) != secretBytes || len(id) != idHexLen || !isLowerHex(id) {
		return "", errors.New("this token has no E2B form: only tokens made by quro token create have one")
	}
	return e2bPrefix + id + hex.EncodeToString(b), nil
}

// fromE2B is the Quro form of an API key in E2B's form.
func fromE2B(key string) (string, error) {
	h := strings.TrimPrefix(key, e2bPrefix)
	if len(h) != e2bHexLength || !isLowerHex(h) {
		return "", fmt.Errorf("malformed API key: Quro's E2B-form keys are e2b_ and %d lowercase hex digits (quro token create --e2b prints one)", e2bHexLength)
	}
	b, err := hex.DecodeString(h[idHexLen:])
	if err != nil {
		return "", fmt.Errorf("malformed API key: %v", err)
	}
	return prefix + h[:idHexLen] + "_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// TokenID is the id of a token in either form ("" when it names none),
// for commands given a whole token where an id will do.
func TokenID(token string) string {
	if strings.HasPrefix(token, e2bPrefix) {
		if h := strings.TrimPrefix(token, e2bPrefix); len(h) >= idHexLen {
			return h[:idHexLen]
		}
		return ""
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(token, prefix), "_")
	return id
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
