package session

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/quro-dev/quro/internal/store"
)

// Session uids. Each session gets its uid from the store when it is made
// (store.CreateSession): unique among sessions, and never one that a
// destroyed session may still use. Sessions of schema 2 had a uid derived
// from a hash of their workspace path; hashes collide (two of about 1,200
// sessions share one), and two sessions with one uid could act as each
// other. When the manager opens such a store:
//
//   - a session whose old uid is its own keeps it: its files are owned by
//     it;
//   - of sessions that shared one, the oldest keeps it and each other one
//     gets a fresh uid, and its directories are handed over (chowned) from
//     the old uid to the new one before the manager serves anything; a
//     handover that fails is retried on the next open (and the sandbox
//     hands a workspace over again whenever its top directory is not the
//     session's).

// legacyUID is the uid schema 2 gave the session whose workspace is dir:
// 2,000,000 + fnv-32a(dir) mod 1,000,000.
func legacyUID(dir string) int {
	h := fnv.New32a()
	h.Write([]byte(filepath.Clean(dir)))
	return store.UIDFirst + int(h.Sum32()%(store.UIDLimit-store.UIDFirst))
}

// settleUIDs gives every session without a uid one, finishes pending
// handovers and releases the uids of destroyed sessions that are gone.
func (m *Manager) settleUIDs(ctx context.Context) error {
	if _, err := m.store.AssignUIDs(ctx, func(id string) int {
		return legacyUID(filepath.Join(m.root, id, "workspace"))
	}); err != nil {
		return err
	}
	hs, err := m.store.Handovers(ctx)
	if err != nil {
		return err
	}
	for _, h := range hs {
		row, err := m.store.SessionByID(ctx, h.SessionID)
		if errors.Is(err, store.ErrNotFound) {
			_ = m.store.HandoverDone(ctx, h.SessionID) // if not, the next start finds it again and retries
			continue
		}
		if err != nil {
			return err
		}
		s := m.fromRow(row)
		if os.Geteuid() == 0 {
			if err := chownTree(h.OldUID, s.UID, s.Workspace(), s.TmpDir()); err != nil {
				return fmt.Errorf("session %s: hand its directories from uid %d to its own uid %d: %w", s.ID, h.OldUID, s.UID, err)
			}
		}
		if err := m.store.HandoverDone(ctx, h.SessionID); err != nil {
			return err
		}
	}
	m.reapUIDs(ctx)
	return nil
}

// chownTree gives what old owns under each dir to uid, the directories
// themselves last, so that an interrupted handover is seen (the top
// directory still old's) and done again.
func chownTree(old, uid int, dirs ...string) error {
	for _, d := range dirs {
		var paths []string
		err := filepath.WalkDir(d, func(p string, _ fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			paths = append(paths, p)
			return nil
		})
		if err != nil {
			return err
		}
		for _, p := range slices.Backward(paths) {
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == old {
				if err := os.Lchown(p, uid, uid); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// reapUIDs releases the uid of every destroyed session whose directory is
// gone (removing it again if needed) and under which no process runs. A
// uid that is not released now stays reserved, and is looked at again on
// the next destroy and the next open.
func (m *Manager) reapUIDs(ctx context.Context) {
	retired, err := m.store.RetiredUIDs(ctx)
	if err != nil || len(retired) == 0 {
		return
	}
	busy := uidsInUse()
	for _, r := range retired {
		if m.isReleasing(r.SessionID) {
			continue // its own release removes the directory, then reaps
		}
		if idRE.MatchString(r.SessionID) {
			if err := os.RemoveAll(filepath.Join(m.root, r.SessionID)); err != nil {
				continue
			}
		}
		if busy[r.UID] {
			continue
		}
		_ = m.store.ReleaseUID(ctx, r.UID) // if not, it stays retired and the next pass retries
	}
}

// uidsInUse are the uids (real, effective, saved or filesystem) of every
// process this server can see.
func uidsInUse() map[int]bool {
	out := map[int]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f, ok := strings.CutPrefix(line, "Uid:"); ok {
				for _, u := range strings.Fields(f) {
					if n, err := strconv.Atoi(u); err == nil {
						out[n] = true
					}
				}
				break
			}
		}
	}
	return out
}
