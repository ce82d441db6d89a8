package chunks_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/levers9/levers9/internal/chunks"
)

func TestSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      string
		size    int
		failAt  int // the send call that fails (0: none)
		want    []string
		wantErr bool
	}{
		{name: "empty still sends the header", in: "", size: 4, want: []string{""}},
		{name: "exact chunks", in: "abcdefgh", size: 4, want: []string{"abcd", "efgh"}},
		{name: "a short last chunk", in: "abcdefghij", size: 4, want: []string{"abcd", "efgh", "ij"}},
		{name: "a refused send stops quietly", in: "abcdefghij", size: 4, failAt: 2, want: []string{"abcd", "efgh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			var firsts []bool
			err := chunks.Send(strings.NewReader(tc.in), tc.size, func(data []byte, first bool) error {
				got = append(got, string(data))
				firsts = append(firsts, first)
				if len(got) == tc.failAt {
					return errors.New("server ended the call")
				}
				return nil
			})
			if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("sent %q, %v; want %q", got, err, tc.want)
			}
			for i, f := range firsts {
				if f != (i == 0) {
					t.Fatalf("first flags %v", firsts)
				}
			}
		})
	}
	t.Run("a read error is returned", func(t *testing.T) {
		boom := errors.New("disk gone")
		r := io.MultiReader(bytes.NewReader([]byte("abcdef")), iotest.ErrReader(boom))
		if err := chunks.Send(r, 4, func([]byte, bool) error { return nil }); !errors.Is(err, boom) {
			t.Fatalf("err = %v, want %v", err, boom)
		}
	})
}
