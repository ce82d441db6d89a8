package inventory

import (
	"reflect"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/testenv"
)

func TestFilterVisible(t *testing.T) {
	t.Parallel()
	gpus := []GPU{
		{Index: 0, UUID: "GPU-aaa"},
		{Index: 1, UUID: "GPU-bbb"},
		{Index: 2, UUID: "GPU-ccc"},
	}
	tests := []struct {
		spec    string
		want    []int // indices kept
		wantErr string
	}{
		{spec: "all", want: []int{0, 1, 2}},
		{spec: " all ", want: []int{0, 1, 2}},
		{spec: "", want: nil},
		{spec: "none", want: nil},
		{spec: "void", want: nil},
		{spec: "1", want: []int{1}},
		{spec: "2,0", want: []int{0, 2}},
		{spec: "GPU-ccc, 1", want: []int{1, 2}},
		{spec: "3", wantErr: `entry 0 ("3"): no such GPU`},
		{spec: "0,GPU-zzz", wantErr: `entry 1 ("GPU-zzz"): no such GPU`},
		{spec: "0,,1", wantErr: `entry 1 (""): no such GPU`},
		{spec: "0,GPU-aaa", wantErr: `entry 1 ("GPU-aaa"): GPU listed twice`},
		{spec: "-1", wantErr: `entry 0 ("-1"): no such GPU`},
		{spec: "ALL", wantErr: `entry 0 ("ALL"): no such GPU`},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			t.Parallel()
			got, err := FilterVisible(gpus, tt.spec)
			testenv.CheckErr(t, err, tt.wantErr)
			var idx []int
			for _, g := range got {
				idx = append(idx, g.Index)
			}
			if !reflect.DeepEqual(idx, tt.want) {
				t.Errorf("FilterVisible(%q) kept %v, want %v", tt.spec, idx, tt.want)
			}
		})
	}
}

func FuzzFilterVisible(f *testing.F) {
	for _, s := range []string{"all", "", "none", "0,1", "GPU-bbb", "1,1", "0,,", "99"} {
		f.Add(s)
	}
	gpus := []GPU{{Index: 0, UUID: "GPU-aaa"}, {Index: 1, UUID: "GPU-bbb"}}
	f.Fuzz(func(t *testing.T, spec string) {
		got, err := FilterVisible(gpus, spec)
		if err != nil {
			if got != nil || !strings.Contains(err.Error(), "visible devices: entry ") {
				t.Fatalf("FilterVisible(%q) = %v, %v", spec, got, err)
			}
			return
		}
		if len(got) > len(gpus) {
			t.Fatalf("FilterVisible(%q) returned %d GPUs from %d", spec, len(got), len(gpus))
		}
		for i := 1; i < len(got); i++ {
			if got[i].Index <= got[i-1].Index {
				t.Fatalf("FilterVisible(%q) = %v: order or uniqueness lost", spec, got)
			}
		}
	})
}
