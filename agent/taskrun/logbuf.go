package taskrun

import (
	"bytes"
	"sync"
	"time"
)

// Stream names the output stream a line came from.
type Stream string

// The streams.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// LogLine is one line of a container's output.
type LogLine struct {
	Stream Stream
	// Time is when the agent read the line.
	Time time.Time
	// Text is the line without its newline.
	Text string
	// Partial marks a line cut at the maximum line length (the rest
	// follows in the next line) or left unterminated at exit.
	Partial bool
	// DroppedBefore counts lines lost to a full buffer just before this
	// one, so a reader can mark the gap.
	DroppedBefore uint64
	// End is the offset in the container's output file of its stream just
	// past this line: once the line is delivered, a restarted agent
	// resumes the stream there (Shipped).
	End int64
}

// lineQueue is a bounded FIFO of lines shared by both streams, bounded in
// lines and in bytes of text. Pushing never blocks: when full, the oldest
// lines are dropped (the end of a task's output usually says most) and
// counted.
type lineQueue struct {
	// notify has room for one wake-up; the pump drains everything queued
	// per wake-up.
	notify chan struct{}

	// mu guards the fields below.
	mu       sync.Mutex
	ring     []LogLine
	head, n  int
	bytes    int // text bytes queued
	maxBytes int
	dropped  uint64 // total
	gap      uint64 // dropped since the last pop
	closed   bool
}

// newLineQueue holds at most capacity lines and maxBytes bytes of text
// (a longer single line is still kept, alone).
func newLineQueue(capacity, maxBytes int) *lineQueue {
	return &lineQueue{ring: make([]LogLine, capacity), maxBytes: maxBytes, notify: make(chan struct{}, 1)}
}

func (q *lineQueue) push(l LogLine) {
	q.mu.Lock()
	if q.closed {
		q.dropped++
		q.mu.Unlock()
		return
	}
	for q.n > 0 && (q.n == len(q.ring) || q.bytes+len(l.Text) > q.maxBytes) {
		q.bytes -= len(q.ring[q.head].Text)
		q.ring[q.head] = LogLine{}
		q.head = (q.head + 1) % len(q.ring)
		q.n--
		q.dropped++
		q.gap++
	}
	q.ring[(q.head+q.n)%len(q.ring)] = l
	q.n++
	q.bytes += len(l.Text)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// pop returns the oldest line, with the gap before it.
func (q *lineQueue) pop() (LogLine, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return LogLine{}, false
	}
	l := q.ring[q.head]
	q.bytes -= len(l.Text)
	q.ring[q.head] = LogLine{}
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	l.DroppedBefore += q.gap
	q.gap = 0
	return l, true
}

// close refuses further lines and counts what is still queued as dropped
// when discard is set.
func (q *lineQueue) close(discard bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if discard {
		q.dropped += uint64(q.n)
		q.head, q.n, q.bytes = 0, 0, 0
		clear(q.ring)
	}
}

func (q *lineQueue) droppedLines() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped
}

// lineWriter splits one stream into lines and pushes them; it is the
// io.Writer the runtime's output goes to, so it never blocks.
type lineWriter struct {
	stream  Stream
	q       *lineQueue
	now     func() time.Time
	maxLine int

	// mu guards partial and pos.
	mu      sync.Mutex
	partial []byte
	// pos is the stream offset of the first byte not yet in a line.
	pos int64
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			for len(w.partial) >= w.maxLine {
				w.emit(w.partial[:w.maxLine], true)
				w.partial = append(w.partial[:0], w.partial[w.maxLine:]...)
			}
			break
		}
		line := p[:i]
		if len(w.partial) > 0 {
			line = append(w.partial, line...)
			w.partial = w.partial[:0]
		}
		for len(line) > w.maxLine {
			w.emit(line[:w.maxLine], true)
			line = line[w.maxLine:]
		}
		w.pos++ // the newline
		w.emit(line, false)
		p = p[i+1:]
	}
	return n, nil
}

func (w *lineWriter) emit(b []byte, partial bool) {
	w.pos += int64(len(b))
	w.q.push(LogLine{Stream: w.stream, Time: w.now(), Text: string(b), Partial: partial, End: w.pos})
}

// flush pushes an unterminated last line.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.emit(w.partial, true)
		w.partial = nil
	}
}

// empty reports whether no line is queued.
func (q *lineQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n == 0
}

// countDropped adds lines lost after leaving the queue (a refusing sink).
func (q *lineQueue) countDropped(n uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dropped += n
}
