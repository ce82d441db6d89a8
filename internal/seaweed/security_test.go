package seaweed_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/internal/seaweed/seaweedtest"
)

// checkSecured is TestCluster's proof that the cluster's ports refuse a
// caller without levers9's credentials and serve one with them.
func checkSecured(t *testing.T, env *seaweedtest.Env) {
	ctx := context.Background()
	sec := env.Security
	o := env.Cluster.Options()
	hp := func(port int) string { return net.JoinHostPort(o.Host, strconv.Itoa(port)) }

	t.Run("files are 0600", func(t *testing.T) {
		st, err := os.Stat(sec.Dir)
		if err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("security dir: %v %v, want 0700", st.Mode(), err)
		}
		files, _ := filepath.Glob(filepath.Join(sec.Dir, "*"))
		for _, s := range []string{"master", "volume", "filer"} {
			files = append(files, filepath.Join(env.Dir, s, "security.toml"))
		}
		for _, f := range files {
			st, err := os.Stat(f)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("%s: %v %v, want 0600", f, st.Mode(), err)
			}
		}
	})

	t.Run("filer HTTP wants a JWT", func(t *testing.T) {
		for _, keys := range []seaweed.FilerKeys{{}, {Write: []byte(strings.Repeat("x", 64)), Read: []byte(strings.Repeat("x", 64))}} {
			f := &seaweed.Filer{URL: env.Cluster.FilerURL(), Keys: keys}
			if _, err := f.List(ctx, "/"); err == nil || !strings.Contains(err.Error(), "401") {
				t.Errorf("listing with keys %q: %v, want 401", keys.Read, err)
			}
			if err := f.Put(ctx, "/l9sec/x", strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "401") {
				t.Errorf("writing with keys %q: %v, want 401", keys.Write, err)
			}
			if err := f.Delete(ctx, "/l9sec"); err == nil || !strings.Contains(err.Error(), "401") {
				t.Errorf("deleting with keys %q: %v, want 401", keys.Write, err)
			}
		}
		if err := env.Filer.Put(ctx, "/l9sec/x", strings.NewReader("x")); err != nil {
			t.Fatalf("with the cluster's keys: %v", err)
		}
		if _, err := env.Filer.List(ctx, "/l9sec"); err != nil {
			t.Fatalf("with the cluster's keys: %v", err)
		}
	})

	t.Run("gRPC is mutual TLS", func(t *testing.T) {
		ca, err := os.ReadFile(sec.CAPath())
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		cert := func(name string) []tls.Certificate {
			c, err := tls.LoadX509KeyPair(sec.CertPath(name), sec.KeyPath(name))
			if err != nil {
				t.Fatal(err)
			}
			return []tls.Certificate{c}
		}
		ping := func(addr, method string, creds credentials.TransportCredentials) error {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				return err
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return conn.Invoke(cctx, method, &emptypb.Empty{}, &emptypb.Empty{})
		}
		tlsWith := func(certs []tls.Certificate) credentials.TransportCredentials {
			// weed checks the chain, not host names.
			return credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: certs, ServerName: "filer", InsecureSkipVerify: true})
		}
		filer, master, volume := hp(o.FilerGRPCPort), hp(o.MasterGRPCPort), hp(o.VolumeGRPCPort)
		const filerPing, masterPing, volumePing = "/filer_pb.SeaweedFiler/Ping", "/master_pb.Seaweed/Ping", "/volume_server_pb.VolumeServer/Ping"
		for _, c := range []struct {
			what, addr, method string
			creds              credentials.TransportCredentials
			ok                 bool
		}{
			{"filer, plaintext", filer, filerPing, insecure.NewCredentials(), false},
			{"filer, TLS without a client certificate", filer, filerPing, tlsWith(nil), false},
			{"filer, a client certificate of another CA", filer, filerPing, tlsWith(selfSigned(t, "client")), false},
			{"filer, the client certificate", filer, filerPing, tlsWith(cert(seaweed.ClientName)), true},
			{"master, plaintext", master, masterPing, insecure.NewCredentials(), false},
			{"master, the client certificate (mounts reach the filer only)", master, masterPing, tlsWith(cert(seaweed.ClientName)), false},
			{"master, the filer's certificate", master, masterPing, tlsWith(cert("filer")), true},
			{"volume server, plaintext", volume, volumePing, insecure.NewCredentials(), false},
			{"volume server, the client certificate", volume, volumePing, tlsWith(cert(seaweed.ClientName)), false},
			{"volume server, the master's certificate", volume, volumePing, tlsWith(cert("master")), true},
		} {
			err := ping(c.addr, c.method, c.creds)
			if (err == nil) != c.ok {
				t.Errorf("%s: ping err = %v, want ok %v", c.what, err, c.ok)
			}
		}
	})

	t.Run("volume server wants a JWT", func(t *testing.T) {
		// The master assigns (this host only); the write needs its token.
		resp, err := http.Get("http://" + hp(o.MasterPort) + "/dir/assign")
		if err != nil {
			t.Fatal(err)
		}
		var a struct{ Fid, URL, Auth string }
		json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		// The master sends the write token as a header.
		if h := resp.Header.Get("Authorization"); len(h) > 7 {
			a.Auth = h[7:]
		}
		if a.Fid == "" || a.Auth == "" {
			t.Fatalf("assign answered %+v, want a fid and a token", a)
		}
		upload := func(auth string) int {
			var body bytes.Buffer
			mw := multipart.NewWriter(&body)
			fw, _ := mw.CreateFormFile("file", "x")
			fw.Write([]byte("secret data"))
			mw.Close()
			req, _ := http.NewRequest(http.MethodPost, "http://"+a.URL+"/"+a.Fid, &body)
			req.Header.Set("Content-Type", mw.FormDataContentType())
			if auth != "" {
				req.Header.Set("Authorization", "Bearer "+auth)
			}
			return status(t, req)
		}
		if s := upload(""); s != http.StatusUnauthorized {
			t.Errorf("write without a token: %d, want 401", s)
		}
		if s := upload(a.Auth); s/100 != 2 {
			t.Fatalf("write with the master's token: %d", s)
		}
		read := func(key string) int {
			req, _ := http.NewRequest(http.MethodGet, "http://"+a.URL+"/"+a.Fid, nil)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+volumeToken(key, a.Fid))
			}
			return status(t, req)
		}
		if s := read(""); s != http.StatusUnauthorized {
			t.Errorf("read without a token: %d, want 401", s)
		}
		if s := read(strings.Repeat("y", 64)); s != http.StatusUnauthorized {
			t.Errorf("read with a wrong key: %d, want 401", s)
		}
		if s := read(sec.VolumeReadKey); s != http.StatusOK {
			t.Errorf("read with the read key: %d, want 200", s)
		}
		req, _ := http.NewRequest(http.MethodDelete, "http://"+a.URL+"/"+a.Fid, nil)
		if s := status(t, req); s != http.StatusUnauthorized {
			t.Errorf("delete without a token: %d, want 401", s)
		}
	})

	t.Run("master HTTP answers this host only", func(t *testing.T) {
		if o.Host != "127.0.0.1" {
			t.Skip("the cluster is not on loopback")
		}
		c := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}
		resp, err := c.Get("http://" + hp(o.MasterPort) + "/dir/assign")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("assign from 127.0.0.2: %s, want 401", resp.Status)
		}
	})

	t.Run("no secret in argv", func(t *testing.T) {
		secrets := []string{sec.VolumeWriteKey, sec.VolumeReadKey, sec.FilerWriteKey, sec.FilerReadKey, env.PG.Password}
		for _, p := range env.Cluster.Processes() {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID()))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range secrets {
				if strings.Contains(string(b), s) {
					t.Errorf("%s's argv holds a secret", p.Name)
				}
			}
		}
	})
}

func status(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// volumeToken is weed's SeaweedFileIdClaims token for fid.
func volumeToken(key, fid string) string {
	enc := base64.RawURLEncoding
	claims, _ := json.Marshal(map[string]any{"fid": fid, "exp": time.Now().Add(time.Minute).Unix()})
	s := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc.EncodeToString(claims)
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(s))
	return s + "." + enc.EncodeToString(mac.Sum(nil))
}

// selfSigned is a certificate named cn of a CA the cluster does not know.
func selfSigned(t *testing.T, cn string) []tls.Certificate {
	t.Helper()
	s, err := seaweed.EnsureSecurity(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.LoadX509KeyPair(s.CertPath(cn), s.KeyPath(cn))
	if err != nil {
		t.Fatal(err)
	}
	return []tls.Certificate{c}
}
