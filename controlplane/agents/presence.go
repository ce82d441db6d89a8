package agents

import (
	"context"
	"encoding/json"
	"time"

	"github.com/levers9/levers9/controlplane/bus"
)

// A presence record says which replica holds an agent's tunnel:
// levers9:presence:<machine> = {"replica", "transport"} with a TTL the
// holder refreshes. A crashed replica's claims expire by themselves.
type presenceRecord struct {
	Replica   string `json:"replica"`
	Transport string `json:"transport"`
}

func (r *Registry) claimPresence(ctx context.Context, machineID, transport string) {
	b, _ := json.Marshal(presenceRecord{Replica: r.replica, Transport: transport})
	if err := r.cfg.Redis.Set(ctx, bus.PresenceKey(machineID), b, r.cfg.PresenceTTL).Err(); err != nil {
		r.cfg.Log.Warn("presence not recorded in Redis; other replicas cannot reach this agent until it is", "machine_id", machineID, "err", err)
	}
}

// releasePresence deletes the claim only if it is still this replica's.
func (r *Registry) releasePresence(ctx context.Context, machineID string) {
	const script = `local v = redis.call('GET', KEYS[1])
if v and cjson.decode(v).replica == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`
	_ = r.cfg.Redis.Eval(ctx, script, []string{bus.PresenceKey(machineID)}, r.replica).Err()
}

func (r *Registry) presence(ctx context.Context, machineID string) (presenceRecord, bool) {
	var p presenceRecord
	b, err := r.cfg.Redis.Get(ctx, bus.PresenceKey(machineID)).Bytes()
	if err != nil || json.Unmarshal(b, &p) != nil {
		return p, false
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
