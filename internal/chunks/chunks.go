// Package chunks owns sending a reader's bytes over a gRPC client stream
// in bounded messages (volume file and image blob uploads). It knows no
// message types: the caller builds each message.
package chunks

import (
	"errors"
	"io"
)

// Send reads r to its end in pieces of at most size bytes and hands each to
// send; the first call has first=true and comes even for an empty r (it
// carries the upload's header). A send error ends the loop without an
// error: the server ended the call, and the stream's CloseAndRecv says why.
// Errors are r's.
func Send(r io.Reader, size int, send func(data []byte, first bool) error) error {
	buf := make([]byte, size)
	first := true
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 || first {
			if send(buf[:n], first) != nil {
				return nil
			}
			first = false
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
