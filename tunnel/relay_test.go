package tunnel_test

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// relay forwards TCP and UDP from one local port to a target, like a NAT or
// load balancer in between. It can drop flows idle longer than idle (the way
// NAT bindings expire) and can blackhole: swallow everything silently, no
// RST, no FIN, either for every flow or (freeze) for the flows open now,
// the way a peer that died without a word looks while its replacement
// answers new connections.
type relay struct {
	addr      string
	target    string
	idle      time.Duration
	blackhole atomic.Bool
	frozenTo  atomic.Int64 // flows born before this (unix nanos) are swallowed
	expired   atomic.Int64
	flows     atomic.Int64
	tcp       net.Listener
	udp       *net.UDPConn
	wg        sync.WaitGroup
	done      chan struct{}

	// mu guards conns and maps.
	mu    sync.Mutex
	conns map[net.Conn]*atomic.Int64 // last activity, unix nanos
	maps  map[string]*udpFlow
}

type udpFlow struct {
	up   *net.UDPConn
	born int64
	last atomic.Int64
}

// freeze swallows the flows open now; new flows pass.
func (r *relay) freeze() { r.frozenTo.Store(time.Now().UnixNano()) }

// swallowed says whether a flow born then is blackholed.
func (r *relay) swallowed(born int64) bool {
	return r.blackhole.Load() || born < r.frozenTo.Load()
}

func newRelay(t testing.TB, target string, idle time.Duration) *relay {
	t.Helper()
	r := &relay{target: target, idle: idle, done: make(chan struct{}), conns: map[net.Conn]*atomic.Int64{}, maps: map[string]*udpFlow{}}
	var err error
	for range 20 {
		r.tcp, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ua, _ := net.ResolveUDPAddr("udp", r.tcp.Addr().String())
		r.udp, err = net.ListenUDP("udp", ua)
		if err == nil {
			break
		}
		_ = r.tcp.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	r.addr = r.tcp.Addr().String()
	r.wg.Add(3)
	go r.acceptTCP()
	go r.readUDP()
	go r.janitor()
	t.Cleanup(r.close)
	return r
}

func (r *relay) close() {
	close(r.done)
	_ = r.tcp.Close()
	_ = r.udp.Close()
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	for _, f := range r.maps {
		_ = f.up.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *relay) acceptTCP() {
	defer r.wg.Done()
	for {
		c, err := r.tcp.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.flows.Add(1)
		born := time.Now().UnixNano()
		last := new(atomic.Int64)
		last.Store(born)
		r.mu.Lock()
		r.conns[c] = last
		r.conns[up] = last
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pipe(c, up, born, last)
		go r.pipe(up, c, born, last)
	}
}

func (r *relay) pipe(from, to net.Conn, born int64, last *atomic.Int64) {
	defer r.wg.Done()
	defer func() { _ = from.Close(); _ = to.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !r.swallowed(born) {
			last.Store(time.Now().UnixNano())
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *relay) readUDP() {
	defer r.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := r.udp.ReadFromUDP(buf)
		if err != nil {
			return
		}
		r.mu.Lock()
		f, ok := r.maps[from.String()]
		if !ok {
			ta, _ := net.ResolveUDPAddr("udp", r.target)
			up, err := net.DialUDP("udp", nil, ta)
			if err != nil {
				r.mu.Unlock()
				continue
			}
			f = &udpFlow{up: up, born: time.Now().UnixNano()}
			r.maps[from.String()] = f
			r.flows.Add(1)
			r.wg.Add(1)
			go r.udpBack(f, from)
		}
		r.mu.Unlock()
		if r.swallowed(f.born) {
			continue
		}
		f.last.Store(time.Now().UnixNano())
		_, _ = f.up.Write(buf[:n])
	}
}

func (r *relay) udpBack(f *udpFlow, client *net.UDPAddr) {
	defer r.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.up.Read(buf)
		if err != nil {
			return
		}
		if r.swallowed(f.born) {
			continue
		}
		f.last.Store(time.Now().UnixNano())
		if _, err := r.udp.WriteToUDP(buf[:n], client); err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// janitor expires idle flows: TCP flows are closed, UDP mappings forgotten
// (the next packet gets a new source port, like a NAT rebinding).
func (r *relay) janitor() {
	defer r.wg.Done()
	if r.idle == 0 {
		<-r.done
		return
	}
	t := time.NewTicker(r.idle / 10)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-t.C:
		}
		cut := time.Now().Add(-r.idle).UnixNano()
		r.mu.Lock()
		for c, last := range r.conns {
			if last.Load() < cut {
				_ = c.Close()
				delete(r.conns, c)
				r.expired.Add(1)
			}
		}
		for k, f := range r.maps {
			if f.last.Load() < cut {
				_ = f.up.Close()
				delete(r.maps, k)
				r.expired.Add(1)
			}
		}
		r.mu.Unlock()
	}
}
