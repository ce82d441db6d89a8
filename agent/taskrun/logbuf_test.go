package taskrun

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

func fixedNow() time.Time { return time.Unix(1700000000, 0) }

func drain(q *lineQueue) []LogLine {
	var out []LogLine
	for {
		l, ok := q.pop()
		if !ok {
			return out
		}
		out = append(out, l)
	}
}

func TestLineWriterSplits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		want   []string // text, with a trailing "+" for partial lines
	}{
		{"lines", []string{"a\nb\n"}, []string{"a", "b"}},
		{"split across writes", []string{"he", "llo\nwor", "ld\n"}, []string{"hello", "world"}},
		{"empty lines", []string{"\n\nx\n"}, []string{"", "", "x"}},
		{"unterminated", []string{"a\nrest"}, []string{"a", "rest+"}},
		{"long line cut", []string{"0123456789ab\n"}, []string{"01234+", "56789+", "ab"}},
		{"long partial cut", []string{"0123456", "789"}, []string{"01234+", "56789+"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newLineQueue(100, 1<<10)
			w := &lineWriter{stream: Stderr, q: q, now: fixedNow, maxLine: 5}
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			w.flush()
			var got []string
			for _, l := range drain(q) {
				if l.Stream != Stderr || !l.Time.Equal(fixedNow()) {
					t.Errorf("line %+v: wrong stream or time", l)
				}
				s := l.Text
				if l.Partial {
					s += "+"
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("lines %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLineQueueDropsOldest(t *testing.T) {
	q := newLineQueue(3, 1<<10)
	for _, s := range []string{"1", "2", "3", "4", "5"} {
		q.push(LogLine{Text: s})
	}
	got := drain(q)
	if len(got) != 3 || got[0].Text != "3" || got[0].DroppedBefore != 2 || got[1].DroppedBefore != 0 || got[2].Text != "5" {
		t.Errorf("queue kept %+v, want 3,4,5 with 2 dropped before 3", got)
	}
	q.push(LogLine{Text: "6"})
	q.close(true)
	q.push(LogLine{Text: "7"})
	if _, ok := q.pop(); ok || q.droppedLines() != 4 {
		t.Errorf("after discarding close: dropped %d, want 4 and an empty queue", q.droppedLines())
	}
}

// FuzzLineWriter: whatever the writes, the lines joined back give the
// input, no line is longer than the limit, and nothing is lost.
func FuzzLineWriter(f *testing.F) {
	f.Add([]byte("hello\nworld\n"), uint8(3), uint8(4))
	f.Add([]byte("\n\n\n"), uint8(1), uint8(1))
	f.Add([]byte("no newline at all, quite long"), uint8(7), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, chunk, maxLine uint8) {
		if chunk == 0 || maxLine == 0 {
			return
		}
		q := newLineQueue(len(data)+2, len(data)+1)
		w := &lineWriter{stream: Stdout, q: q, now: fixedNow, maxLine: int(maxLine)}
		for rest := data; len(rest) > 0; {
			n := min(int(chunk), len(rest))
			_, _ = w.Write(rest[:n])
			rest = rest[n:]
		}
		w.flush()
		var b strings.Builder
		for _, l := range drain(q) {
			if len(l.Text) > int(maxLine) {
				t.Fatalf("line of %d bytes over the %d limit", len(l.Text), maxLine)
			}
			b.WriteString(l.Text)
			if !l.Partial {
				b.WriteByte('\n')
			}
		}
		if !bytes.Equal([]byte(b.String()), data) || q.droppedLines() != 0 {
			t.Fatalf("rejoined %q, want %q (dropped %d)", b.String(), data, q.droppedLines())
		}
	})
}

func TestLineQueueByteBound(t *testing.T) {
	q := newLineQueue(100, 10)
	for _, s := range []string{"aaaa", "bbbb", "cccc", "0123456789abc", "d"} {
		q.push(LogLine{Text: s})
	}
	var got []string
	for _, l := range drain(q) {
		got = append(got, l.Text)
	}
	// "cccc" pushes out "aaaa"; the 13-byte line is kept alone; "d" fits
	// only once it is gone.
	if !slices.Equal(got, []string{"d"}) || q.droppedLines() != 4 {
		t.Errorf("kept %q, dropped %d; want [d] and 4", got, q.droppedLines())
	}
	q.push(LogLine{Text: "12345"})
	q.push(LogLine{Text: "67890"})
	if l, _ := q.pop(); l.Text != "12345" || q.bytes != 5 {
		t.Errorf("pop %q leaves %d bytes", l.Text, q.bytes)
	}
}
