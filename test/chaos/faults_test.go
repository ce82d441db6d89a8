package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/levers9/levers9/internal/testenv"
)

// fault is one kind of failure the run injects.
type fault int

const (
	faultKillReplica fault = iota
	faultKillAgent
	faultStopRedis
	faultRestartPostgres
	faultDropPackets
	faultKinds
)

func (f fault) String() string {
	return [...]string{"kill-replica", "kill-agent", "stop-redis", "restart-postgres", "drop-packets"}[f]
}

// faulter injects faults into w; sizes scale the outages (short form
// shorter than the 10 s and a minute).
type faulter struct {
	w   *world
	rng *rand.Rand
	// redisDown and dropFor are the Redis outage and the packet loss's
	// length.
	redisDown, dropFor time.Duration
	log                func(format string, args ...any)
	count              map[fault]int
}

// inject runs one fault to its end (the broken part is back).
func (f *faulter) inject(t *testing.T, k fault) {
	t.Helper()
	f.count[k]++
	w, rng := f.w, f.rng
	pause := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	switch k {
	case faultKillReplica:
		r := w.replicas[rng.IntN(len(w.replicas))]
		d := pause(500*time.Millisecond, 3*time.Second)
		f.log("fault: SIGKILL %s, start it again after %s", r.name, d.Round(time.Millisecond))
		r.kill()
		time.Sleep(d)
		r.start(t)
	case faultKillAgent:
		a := w.agents[rng.IntN(len(w.agents))]
		d := pause(500*time.Millisecond, 5*time.Second)
		f.log("fault: SIGKILL agent %s (%s), start it again after %s", a.id, a.prefix, d.Round(time.Millisecond))
		a.kill(t)
		time.Sleep(d)
		a.start(t, w.registry)
	case faultStopRedis:
		// SHUTDOWN SAVE: Redis comes back with its data, as a production
		// Redis with persistence does (the test Redis saves nothing on its
		// own). One that loses its data loses live events by design
		// (ARCHITECTURE.md, Redis), which the follower checks would count.
		f.log("fault: stop Redis (SHUTDOWN SAVE) for %s", f.redisDown)
		rdb := redis.NewClient(&redis.Options{Addr: env.Redis.Addr(), Password: env.Redis.Password, MaxRetries: -1})
		_ = rdb.ShutdownSave(context.Background()).Err() // the reply is the connection closing
		rdb.Close()
		testenv.Eventually(t, 30*time.Second, "redis stopped", func() bool {
			c, err := net.DialTimeout("tcp", env.Redis.Addr(), time.Second)
			if err == nil {
				c.Close()
			}
			return err != nil
		})
		time.Sleep(f.redisDown)
		if err := env.Redis.StartServer(context.Background()); err != nil {
			t.Fatalf("start redis: %v", err)
		}
	case faultRestartPostgres:
		f.log("fault: restart Postgres")
		if err := env.PG.StopServer(context.Background()); err != nil {
			t.Fatalf("stop postgres: %v", err)
		}
		time.Sleep(pause(200*time.Millisecond, 2*time.Second))
		if err := env.PG.StartServer(context.Background()); err != nil {
			t.Fatalf("start postgres: %v", err)
		}
	case faultDropPackets:
		f.log("fault: drop 5%% of the tunnels' packets for %s", f.dropFor)
		rules := w.dropRules()
		for _, r := range rules {
			iptables(t, r.ns, append([]string{"-I"}, r.rule...)...)
		}
		time.Sleep(f.dropFor)
		for _, r := range rules {
			iptables(t, r.ns, append([]string{"-D"}, r.rule...)...)
		}
	}
}

type nsRule struct {
	ns   string
	rule []string
}

// dropRules are the rules, in each box, that drop 5% of the traffic to
// and from the replicas' tunnel ports (UDP for QUIC, TCP for TLS+yamux).
func (w *world) dropRules() []nsRule {
	var ports []string
	for _, r := range w.replicas {
		ports = append(ports, r.tunnel[strings.LastIndexByte(r.tunnel, ':')+1:])
	}
	pl := strings.Join(ports, ",")
	var out []nsRule
	for _, b := range w.boxes {
		for _, proto := range []string{"udp", "tcp"} {
			stat := []string{"-m", "statistic", "--mode", "random", "--probability", "0.05", "-j", "DROP"}
			out = append(out,
				nsRule{b.ns, append([]string{"OUTPUT", "-p", proto, "-m", "multiport", "--dports", pl}, stat...)},
				nsRule{b.ns, append([]string{"INPUT", "-p", proto, "-m", "multiport", "--sports", pl}, stat...)})
		}
	}
	return out
}

func iptables(t *testing.T, ns string, args ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "iptables", "-w"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables %s in %s: %v: %s", strings.Join(args, " "), ns, err, out)
	}
}

// plan is the faults of a short run: every kind once, then extra random
// ones, shuffled.
func (f *faulter) plan(extra int) []fault {
	var p []fault
	for k := range faultKinds {
		p = append(p, k)
	}
	for range extra {
		p = append(p, fault(f.rng.IntN(int(faultKinds))))
	}
	f.rng.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

func (f *faulter) total() int {
	n := 0
	for _, c := range f.count {
		n += c
	}
	return n
}

func (f *faulter) summary() string {
	var parts []string
	for k := range faultKinds {
		parts = append(parts, fmt.Sprintf("%s=%d", k, f.count[k]))
	}
	return strings.Join(parts, " ")
}
