package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/levers9/levers9/controlplane/bus"
)

// A presence record says which replica holds an agent's tunnel:
// levers9:presence:<machine> = {"replica", "transport"} with a TTL the
// holder refreshes. A crashed replica's claims expire by themselves.
//
// Records are signed (stamp, replicaauth.go) for the machine they are
// stored under, so a record cannot be forged, or copied to another
// machine's key; one older than presenceMaxAge is refused. Records are read
// many times, so they have no replay check: a replayed genuine record can
// only name a replica that really held the machine, and calls through it
// still wait for that replica to answer a signed ping (forwarder.prove).
type presenceRecord struct {
	stamp
	Replica   string `json:"replica"`
	Transport string `json:"transport"`
}

const presencePurpose = "presence"

func (p *presenceRecord) fields(machineID string) []string {
	return []string{machineID, p.Replica, p.Transport}
}

// encodePresence signs rec for machineID.
func encodePresence(a *replicaAuth, machineID string, rec presenceRecord) []byte {
	rec.stamp = a.sign(presencePurpose, rec.fields(machineID)...)
	b, _ := json.Marshal(rec)
	return b
}

// decodePresence parses machineID's record and checks it (at most maxAge
// old).
func decodePresence(a *replicaAuth, machineID string, raw []byte, maxAge time.Duration) (presenceRecord, error) {
	var p presenceRecord
	if err := json.Unmarshal(raw, &p); err != nil {
		return presenceRecord{}, fmt.Errorf("decode a presence record: %w", err)
	}
	if err := a.verify(p.stamp, maxAge, presencePurpose, p.fields(machineID)...); err != nil {
		return presenceRecord{}, err
	}
	return p, nil
}

// presenceMaxAge is how old a record may be: it is rewritten every third of
// PresenceTTL.
func (r *Registry) presenceMaxAge() time.Duration { return max(replicaWindow, r.cfg.PresenceTTL) }

func (r *Registry) claimPresence(ctx context.Context, machineID, transport string) {
	b := encodePresence(r.auth, machineID, presenceRecord{Replica: r.replica, Transport: transport})
	if err := r.cfg.Redis.Set(ctx, bus.PresenceKey(machineID), b, r.cfg.PresenceTTL).Err(); err != nil {
		r.cfg.Log.Warn("presence not recorded in Redis; other replicas cannot reach this agent until it is", "machine_id", machineID, "err", err)
	}
}

// releasePresence deletes the claim only if it is still this replica's.
func (r *Registry) releasePresence(ctx context.Context, machineID string) {
	const script = `local ok, d = pcall(cjson.decode, redis.call('GET', KEYS[1]) or 'null')
if ok and type(d) == 'table' and d.replica == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`
	_ = r.cfg.Redis.Eval(ctx, script, []string{bus.PresenceKey(machineID)}, r.replica).Err()
}

// presence reads machineID's record; a record that fails the check counts
// as none (and is counted).
func (r *Registry) presence(ctx context.Context, machineID string) (presenceRecord, bool) {
	b, err := r.cfg.Redis.Get(ctx, bus.PresenceKey(machineID)).Bytes()
	if err != nil {
		if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			r.cfg.Log.Debug("presence not read", "machine_id", machineID, "err", err)
		}
		return presenceRecord{}, false
	}
	p, err := decodePresence(r.auth, machineID, b, r.presenceMaxAge())
	if err != nil {
		r.auth.reject("presence record", err)
		return presenceRecord{}, false
	}
	return p, true
}

// presenceLoop refreshes this replica's claims.
func (r *Registry) presenceLoop(ctx context.Context) {
	t := r.cfg.Clock.NewTicker(r.cfg.PresenceTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		for _, a := range r.hub.Agents() {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			r.claimPresence(rctx, a.Identity, string(a.Transport))
			cancel()
		}
	}
}
