package enroll

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestJoinScriptVerifiesTLS: the join script's download never turns off
// certificate checks, pins the controlplane's CA when it has one (for curl
// and for the agent's enrollment), and checks the binary's checksum whatever
// the transport.
func TestJoinScriptVerifiesTLS(t *testing.T) {
	t.Parallel()
	_, tok, _ := MintJoinToken()
	for _, ca := range []string{"-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n", ""} {
		s, err := JoinScript(ScriptParams{MachineID: "m_abc", Pool: "default", ControlplaneGRPC: "10.0.0.1:1993",
			ControlplaneREST: "https://10.0.0.1:1994", CAPEM: ca, AgentSHA256: map[string]string{"linux-amd64": strings.Repeat("a", 64)},
			Token: tok, ExpiresAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`(^|\s)(-k|--insecure|--proxy-insecure|--ssl-no-revoke|--insecure-skip-verify)(\s|$)`).MatchString(s) {
			t.Errorf("the script turns certificate checks off:\n%s", s)
		}
		if !strings.Contains(s, "sha256sum -c") {
			t.Error("the download is not checked against its checksum")
		}
		if ca != "" {
			for _, want := range []string{`CURL_CA="--cacert $ETC_DIR/controlplane-ca.pem"`, `CA_ARG="--ca-file=$ETC_DIR/controlplane-ca.pem"`} {
				if !strings.Contains(s, want) {
					t.Errorf("with a CA the script lacks %s", want)
				}
			}
		}
	}
}
