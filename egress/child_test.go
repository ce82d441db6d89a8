package egress

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
)

// childEnv, when set to a JSON Config, makes the test binary act as an
// agent that applies rules in a loop until it is killed (see
// TestKilledMidApplyConverges).
const childEnv = "L9E_EGRESS_CHILD"

func childApply() int {
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	n, err := NewNode(cfg, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	if err := n.Setup(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for i := 0; ; i++ {
		if _, err := n.AddContainer(ctx, ContainerNet{ID: fmt.Sprintf("child-%d", i), Task: "t", Pool: "p"}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if i == 1 {
			fmt.Println("ready")
		}
		if i >= 2 {
			if err := n.RemoveContainer(ctx, fmt.Sprintf("child-%d", i-2)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
		}
	}
}
