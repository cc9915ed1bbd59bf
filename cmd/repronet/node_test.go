package main

import (
	"reflect"
	"testing"
)

func TestByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"10737418240", 10 << 30, true},
		{"10G", 10 << 30, true},
		{"10GiB", 10 << 30, true},
		{"10gb", 10 << 30, true},
		{"512M", 512 << 20, true},
		{"512 MiB", 512 << 20, true},
		{"64K", 64 << 10, true},
		{"2T", 2 << 40, true},
		{"", 0, false},
		{"G", 0, false},
		{"-1G", 0, false},
		{"1.5G", 0, false},
		{"10X", 0, false},
		{"9000000000T", 0, false},
	}
	for _, tt := range tests {
		var b byteSize
		err := b.Set(tt.in)
		if (err == nil) != tt.ok || (tt.ok && int64(b) != tt.want) {
			t.Errorf("Set(%q) = %d, %v; want %d (ok %v)", tt.in, b, err, tt.want, tt.ok)
		}
	}
}

func TestEnvironmentFlags(t *testing.T) {
	m, err := parseMirrors([]string{"docker.io=http://mirror.lan:5000", "docker.io=https://m2.example.org/", "ghcr.io=http://m3"})
	want := map[string][]string{"docker.io": {"http://mirror.lan:5000", "https://m2.example.org"}, "ghcr.io": {"http://m3"}}
	if err != nil || !reflect.DeepEqual(m, want) {
		t.Fatalf("parseMirrors: %v %v", m, err)
	}
	for _, bad := range []string{"docker.io", "docker.io=ftp://m", "docker.io=http://m/v2"} {
		if _, err := parseMirrors([]string{bad}); err == nil {
			t.Errorf("parseMirrors(%q) accepted", bad)
		}
	}
	p, err := parsePrefixes([]string{"10.0.0.5", "192.168.1.7/24", "fd00::1"})
	if err != nil || len(p) != 3 || p[0].String() != "10.0.0.5/32" || p[1].String() != "192.168.1.0/24" || p[2].String() != "fd00::1/128" {
		t.Fatalf("parsePrefixes: %v %v", p, err)
	}
	if _, err := parsePrefixes([]string{"lan"}); err == nil {
		t.Error("parsePrefixes accepted a name")
	}
}
