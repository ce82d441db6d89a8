package tunneltest

import (
	"context"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// EchoHandler answers an echo call; nil echoes the payload back.
type EchoHandler func(ctx context.Context, in []byte) ([]byte, error)

const echoMethod = "/levers9.tunneltest.Echo/Echo"

// RegisterEcho registers the echo service on s.
func RegisterEcho(s *grpc.Server, h EchoHandler) {
	if h == nil {
		h = func(_ context.Context, in []byte) ([]byte, error) { return in, nil }
	}
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "levers9.tunneltest.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Echo",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.BytesValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				out, err := h(ctx, in.Value)
				if err != nil {
					return nil, err
				}
				return wrapperspb.Bytes(out), nil
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Sink",
			ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				var n int64
				for {
					in := new(wrapperspb.BytesValue)
					if err := ss.RecvMsg(in); err != nil {
						if err == io.EOF {
							return ss.SendMsg(wrapperspb.Int64(n))
						}
						return err
					}
					n += int64(len(in.Value))
				}
			},
		}},
	}, struct{}{})
}

// Echo calls the echo service on cc.
func Echo(ctx context.Context, cc grpc.ClientConnInterface, in []byte) ([]byte, error) {
	out := new(wrapperspb.BytesValue)
	if err := cc.Invoke(ctx, echoMethod, wrapperspb.Bytes(in), out); err != nil {
		return nil, err
	}
	return out.Value, nil
}

// Sink streams chunks to the sink service (think: logs) until ctx ends or
// a send fails; it returns how many bytes were sent.
func Sink(ctx context.Context, cc grpc.ClientConnInterface, chunk []byte) (int64, error) {
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: "Sink", ClientStreams: true}, "/levers9.tunneltest.Echo/Sink")
	if err != nil {
		return 0, err
	}
	msg := wrapperspb.Bytes(chunk)
	var n int64
	for ctx.Err() == nil {
		if err := st.SendMsg(msg); err != nil {
			return n, err
		}
		n += int64(len(chunk))
	}
	return n, ctx.Err()
}
