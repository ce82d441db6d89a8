package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/internal/chunks"
)

// blobRoute is the REST blob upload: PUT /api/v1/blobs/{digest} with the
// blob's raw bytes as the body (application/octet-stream) and its size as
// Content-Length. grpc-gateway can only decode a body into one message, so
// this handler streams the body into ImageService.PutBlob itself, in
// MaxFileChunk messages, never holding more than one. It is outside
// limitBody's 4 MiB: the blob limit bounds it instead, from the declared
// length before anything is read.
const blobRoute = "PUT /api/v1/blobs/{digest}"

// putBlob serves blobRoute over conn, the gateway's in-memory connection:
// the caller's Authorization header goes with the call as the gateway
// forwards it, so the same interceptors authenticate it. Errors have the
// gateway's JSON shape and status; the answer is PutBlob's, in the
// gateway's JSON.
func putBlob(gw *runtime.ServeMux, conn *grpc.ClientConn, limit int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, out := runtime.MarshalerForRequest(gw, r)
		fail := func(err error) {
			// The body may be unread (PutBlob refused it early): the
			// connection cannot carry another request.
			w.Header().Set("Connection", "close")
			runtime.HTTPError(r.Context(), gw, out, w, r, err)
		}
		switch {
		case r.ContentLength < 0:
			// The size goes first in PutBlob; a chunked body has none.
			w.Header().Set("Connection", "close")
			writeJSONError(w, http.StatusLengthRequired, codes.InvalidArgument, "a blob upload needs a Content-Length (the blob's size)")
			return
		case r.ContentLength > limit:
			w.Header().Set("Connection", "close")
			writeJSONError(w, http.StatusRequestEntityTooLarge, codes.ResourceExhausted,
				fmt.Sprintf("blob of %d bytes is over the limit of %d bytes", r.ContentLength, limit))
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		if a := r.Header.Get("Authorization"); a != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", a)
		}
		stream, err := v1.NewImageServiceClient(conn).PutBlob(ctx)
		if err != nil {
			fail(err)
			return
		}
		digest, size := r.PathValue("digest"), r.ContentLength
		err = chunks.Send(r.Body, api.MaxFileChunk, func(data []byte, first bool) error {
			m := &v1.PutBlobRequest{Data: data}
			if first {
				m.Digest, m.Size = digest, size
			}
			return stream.Send(m)
		})
		if err != nil {
			// The body broke off: the call ends without storing anything.
			cancel()
			w.Header().Set("Connection", "close")
			writeJSONError(w, http.StatusBadRequest, codes.InvalidArgument, "reading the request body failed: "+err.Error())
			return
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			fail(err)
			return
		}
		b, err := out.Marshal(resp)
		if err != nil {
			fail(status.Errorf(codes.Internal, "encode the answer: %v", err))
			return
		}
		w.Header().Set("Content-Type", out.ContentType(resp))
		_, _ = w.Write(b)
	}
}
