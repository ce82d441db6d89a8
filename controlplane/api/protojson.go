package api

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// protoJSON stores protobuf messages (inventories) as JSON in Postgres.
var protoJSON = struct {
	Marshal   func(proto.Message) ([]byte, error)
	Unmarshal func([]byte, proto.Message) error
}{
	Marshal:   protojson.Marshal,
	Unmarshal: protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal,
}
