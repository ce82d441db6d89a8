package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/levers9/levers9/tunnel"
	"github.com/levers9/levers9/tunnel/tunneltest"
)

type lossResult struct{ quic, yamux float64 }

// Host objects: namespaces l9tb<hex>s and l9tb<hex>c joined by the veth
// pair l9tb<hex>a/b (10.199.0.1 and .2); the loss rules live inside them.
func sh(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// reconcileBenchNetns removes namespaces a killed run left behind.
func reconcileBenchNetns() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "l9tb") {
			_ = exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
}

func inNS(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// measureLoss puts 1% random loss each way between a controlplane and an
// agent in two network namespaces, runs a bulk stream, and measures the
// round trip of small control messages on another stream of the same
// session, for each transport.
func measureLoss(quick bool) (lossResult, error) {
	var r lossResult
	if os.Geteuid() != 0 {
		return r, errors.New("needs root for network namespaces and iptables")
	}
	reconcileBenchNetns()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := "l9tb" + hex.EncodeToString(b)
	srvNS, cliNS := id+"s", id+"c"
	defer func() {
		_ = exec.Command("ip", "netns", "del", srvNS).Run()
		_ = exec.Command("ip", "netns", "del", cliNS).Run()
	}()
	for _, c := range [][]string{
		{"ip", "netns", "add", srvNS}, {"ip", "netns", "add", cliNS},
		{"ip", "link", "add", id + "a", "netns", srvNS, "type", "veth", "peer", "name", id + "b", "netns", cliNS},
		{"ip", "-n", srvNS, "addr", "add", "10.199.0.1/24", "dev", id + "a"},
		{"ip", "-n", cliNS, "addr", "add", "10.199.0.2/24", "dev", id + "b"},
		{"ip", "-n", srvNS, "link", "set", id + "a", "up"}, {"ip", "-n", cliNS, "link", "set", id + "b", "up"},
		{"ip", "netns", "exec", srvNS, "iptables", "-w", "-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability", "0.01", "-j", "DROP"},
		{"ip", "netns", "exec", cliNS, "iptables", "-w", "-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability", "0.01", "-j", "DROP"},
	} {
		if err := sh(c...); err != nil {
			return r, err
		}
	}
	sh1, err := netns.GetFromName(srvNS)
	if err != nil {
		return r, err
	}
	defer sh1.Close()
	ch, err := netns.GetFromName(cliNS)
	if err != nil {
		return r, err
	}
	defer ch.Close()

	ca, err := tunneltest.NewCA("loss")
	if err != nil {
		return r, err
	}
	stls, _ := ca.ServerTLS()
	ctls, _ := ca.ClientTLS("loss-agent")
	srv, err := tunnel.NewServer(tunnel.ServerConfig{
		Addr: "10.199.0.1:0", TLS: stls,
		Authorize: func(_ context.Context, c *x509Cert) (string, error) { return c.Subject.CommonName, nil },
		OnSession: func(ctx context.Context, s tunnel.Session) {
			for {
				c, err := s.AcceptStream(ctx)
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					var kind [1]byte
					if _, err := io.ReadFull(c, kind[:]); err != nil {
						return
					}
					if kind[0] == 'b' {
						_, _ = io.Copy(io.Discard, c)
						return
					}
					_, _ = io.Copy(c, c) // control: echo
				}()
			}
		},
	})
	if err != nil {
		return r, err
	}
	if err := inNS(sh1, func() error { return srv.Start(context.Background()) }); err != nil {
		return r, err
	}
	defer srv.Stop()
	samples := 400
	if quick {
		samples = 150
	}
	for _, quic := range []bool{true, false} {
		d, err := tunnel.NewDirect(tunnel.ClientConfig{
			Addrs: []string{srv.Addr().String()}, TLS: ctls, Proxy: noProxy,
			DisableQUIC: !quic, DisableTCP: quic,
			DialTCP: func(ctx context.Context, n, a string) (net.Conn, error) {
				var c net.Conn
				err := inNS(ch, func() error {
					var dd net.Dialer
					var err error
					c, err = dd.DialContext(ctx, n, a)
					return err
				})
				return c, err
			},
			ListenUDP: func(context.Context) (net.PacketConn, error) {
				var pc net.PacketConn
				err := inNS(ch, func() error {
					var err error
					pc, err = net.ListenUDP("udp", &net.UDPAddr{})
					return err
				})
				return pc, err
			},
		})
		if err != nil {
			return r, err
		}
		p99, err := lossRun(d, samples)
		if err != nil {
			return r, fmt.Errorf("quic=%v: %w", quic, err)
		}
		if quic {
			r.quic = p99
		} else {
			r.yamux = p99
		}
	}
	fmt.Printf("control p99 beside a bulk stream at 1%% loss: quic %.1f ms, yamux %.1f ms\n", r.quic, r.yamux)
	return r, nil
}

func lossRun(d *tunnel.Direct, samples int) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := d.Dial(ctx, tunnel.DialRace)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	bulk, err := s.OpenStream(ctx)
	if err != nil {
		return 0, err
	}
	defer bulk.Close()
	go func() {
		_, _ = bulk.Write([]byte{'b'})
		for ctx.Err() == nil {
			if _, err := bulk.Write(chunk); err != nil {
				return
			}
		}
	}()
	ctrl, err := s.OpenStream(ctx)
	if err != nil {
		return 0, err
	}
	defer ctrl.Close()
	if _, err := ctrl.Write([]byte{'c'}); err != nil {
		return 0, err
	}
	time.Sleep(500 * time.Millisecond) // let the bulk stream fill the path
	msg := make([]byte, 256)
	lat := make([]float64, 0, samples)
	for range samples {
		_ = ctrl.SetDeadline(time.Now().Add(10 * time.Second))
		t := time.Now()
		if _, err := ctrl.Write(msg); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(ctrl, msg); err != nil {
			return 0, err
		}
		lat = append(lat, float64(time.Since(t).Microseconds())/1000)
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(lat)
	return pct(lat, 0.99), nil
}
