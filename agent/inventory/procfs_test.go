package inventory

import (
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/testenv"
)

const cpuinfoX86 = `processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 85
model name	: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
cpu MHz		: 2499.998
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov
bogomips	: 4999.99

processor	: 1
vendor_id	: GenuineIntel
cpu family	: 6
model		: 85
model name	: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
cpu MHz		: 2499.998

`

const cpuinfoARM64 = `processor	: 0
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x3
CPU part	: 0xd0c
CPU revision	: 1

processor	: 1
BogoMIPS	: 243.75
CPU implementer	: 0x41

processor	: 2
BogoMIPS	: 243.75

processor	: 3
BogoMIPS	: 243.75
`

const cpuinfoPPC64 = `processor	: 0
cpu		: POWER9 (architected), altivec supported
clock		: 2200.000000MHz

processor	: 1
cpu		: POWER9 (architected), altivec supported

timebase	: 512000000
platform	: pSeries
`

func TestParseCPUInfo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    CPU
		wantErr string
	}{
		{name: "x86", in: cpuinfoX86, want: CPU{Count: 2, Model: "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz"}},
		{name: "arm64 has no model", in: cpuinfoARM64, want: CPU{Count: 4}},
		{name: "ppc64", in: cpuinfoPPC64, want: CPU{Count: 2, Model: "POWER9 (architected), altivec supported"}},
		{name: "crlf and spaces", in: "processor : 0\r\nmodel name :  Foo CPU \r\n", want: CPU{Count: 1, Model: "Foo CPU"}},
		{name: "empty", in: "", wantErr: `no "processor" entries`},
		{name: "no processor lines", in: "model name : X\n", wantErr: `no "processor" entries`},
		{name: "processor not a number", in: "processor : 0\nprocessor : x1\n", wantErr: `line 2: processor "x1" is not a number`},
		{name: "processor empty", in: "processor :\n", wantErr: `line 1: processor "" is not a number`},
		{name: "long flags line", in: "processor : 0\nflags : " + strings.Repeat("avx512 ", 20000) + "\n", want: CPU{Count: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseCPUInfo(strings.NewReader(tt.in))
			testenv.CheckErr(t, err, tt.wantErr)
			if got != tt.want {
				t.Errorf("parseCPUInfo = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseMemTotal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    uint64
		wantErr string
	}{
		{name: "real", in: "MemTotal:       24683548 kB\nMemFree:        21471928 kB\nMemAvailable:   23792804 kB\n", want: 24683548 * 1024},
		{name: "not first line", in: "MemFree: 1 kB\nMemTotal: 2048 kB\n", want: 2 * 1024 * 1024},
		{name: "first MemTotal wins", in: "MemTotal: 1 kB\nMemTotal: 2 kB\n", want: 1024},
		{name: "missing", in: "MemFree: 1 kB\n", wantErr: "no MemTotal line"},
		{name: "empty", in: "", wantErr: "no MemTotal line"},
		{name: "no unit", in: "MemTotal: 1234\n", wantErr: `line 1: MemTotal: want "N kB", got "1234"`},
		{name: "wrong unit", in: "MemTotal: 1234 MB\n", wantErr: `want "N kB"`},
		{name: "not a number", in: "Foo: 1\nMemTotal: 12x4 kB\n", wantErr: `line 2: MemTotal: "12x4" is not a number`},
		{name: "negative", in: "MemTotal: -1 kB\n", wantErr: `"-1" is not a number`},
		{name: "zero", in: "MemTotal: 0 kB\n", wantErr: "line 1: MemTotal: is 0"},
		{name: "overflow", in: "MemTotal: 18446744073709551615 kB\n", wantErr: "overflows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseMemTotal(strings.NewReader(tt.in))
			testenv.CheckErr(t, err, tt.wantErr)
			if got != tt.want {
				t.Errorf("parseMemTotal = %d, want %d", got, tt.want)
			}
		})
	}
}

func FuzzParseCPUInfo(f *testing.F) {
	for _, s := range []string{cpuinfoX86, cpuinfoARM64, cpuinfoPPC64, "", "processor : x", "processor:0\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		cpu, err := parseCPUInfo(strings.NewReader(in))
		if err != nil {
			if cpu != (CPU{}) {
				t.Fatalf("error %v with non-zero result %+v", err, cpu)
			}
			return
		}
		if cpu.Count < 1 || cpu.Count > strings.Count(in, "processor") {
			t.Fatalf("count %d for %d \"processor\" substrings", cpu.Count, strings.Count(in, "processor"))
		}
		if cpu.Model != strings.TrimSpace(cpu.Model) {
			t.Fatalf("model %q not trimmed", cpu.Model)
		}
	})
}

func FuzzParseMemTotal(f *testing.F) {
	for _, s := range []string{"MemTotal: 1 kB\n", "MemTotal: 18446744073709551615 kB", "", "MemTotal:", "MemTotal: 0 kB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		n, err := parseMemTotal(strings.NewReader(in))
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with result %d", err, n)
			}
			return
		}
		if n == 0 || n%1024 != 0 {
			t.Fatalf("MemTotal %d bytes: want a non-zero multiple of 1024", n)
		}
	})
}
