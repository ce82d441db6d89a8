package sandbox

import "testing"

func BenchmarkBuildSpec(b *testing.B) {
	h := goldenHost()
	task := goldenTask()
	sec := Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, DropNetRaw: true, Runtime: RuntimeRunc}
	for b.Loop() {
		if _, _, err := BuildSpec(task, sec, h); err != nil {
			b.Fatal(err)
		}
	}
}
