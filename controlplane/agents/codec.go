package agents

import (
	"fmt"

	"google.golang.org/grpc/mem"
)

// rawMessage carries already-marshalled protobuf bytes through a forwarded
// call, so the holder needs no knowledge of the method's types.
type rawMessage struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	m.b = data.Materialize()
	return nil
}
