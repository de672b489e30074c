package recent

import (
	"strconv"
	"testing"
)

func TestSetForgetsTheOldestPastMax(t *testing.T) {
	var s Set
	if s.Has("a") {
		t.Fatal("the zero Set holds a key")
	}
	s.Max = 3
	for i := range 5 {
		s.Add(strconv.Itoa(i))
		s.Add(strconv.Itoa(i)) // twice: counted once
	}
	for i, want := range []bool{false, false, true, true, true} {
		if got := s.Has(strconv.Itoa(i)); got != want {
			t.Errorf("Has(%d) = %v, want %v", i, got, want)
		}
	}
	if len(s.order) != 3 || len(s.has) != 3 {
		t.Errorf("holds %d keys in order, %d in the map; want 3", len(s.order), len(s.has))
	}
}

func TestSetDefaultMax(t *testing.T) {
	var s Set
	for i := range DefaultMax + 1 {
		s.Add(strconv.Itoa(i))
	}
	if s.Has("0") || !s.Has("1") || !s.Has(strconv.Itoa(DefaultMax)) {
		t.Error("the zero Set does not keep the most recent DefaultMax keys")
	}
}

func TestSetDelete(t *testing.T) {
	s := Set{Max: 3}
	for _, k := range []string{"a", "b", "c"} {
		s.Add(k)
	}
	s.Delete("b")
	s.Delete("z") // not there: nothing
	if s.Has("b") || !s.Has("a") || !s.Has("c") {
		t.Fatalf("after Delete(b): a=%v b=%v c=%v", s.Has("a"), s.Has("b"), s.Has("c"))
	}
	s.Add("d") // room for it: a stays
	if !s.Has("a") || len(s.order) != 3 {
		t.Fatalf("after Delete then Add: a=%v, %d in order", s.Has("a"), len(s.order))
	}
}
