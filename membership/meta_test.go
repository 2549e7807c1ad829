package membership

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEncodeMeta_RoundTrip(t *testing.T) {
	start := time.Date(2026, 12, 2, 13, 55, 0, 123456789, time.UTC)
	for _, m := range []Meta{
		{GRPCAddr: "10.0.0.1:9090", Version: "v1.2.3", StartTime: start},
		{GRPCAddr: "[fd00::1]:9090", StartTime: start, Leaving: true},
		{GRPCAddr: "cce-ipam-0.cce-ipam.kube-system.svc:9090", Version: strings.Repeat("v", 300), StartTime: start},
	} {
		b, err := EncodeMeta(m)
		if err != nil {
			t.Fatalf("EncodeMeta(%+v): %v", m, err)
		}
		if len(b) > MetaMaxSize || b[0] != metaFormat {
			t.Fatalf("encoding of %+v: %d bytes, format %d", m, len(b), b[0])
		}
		got, err := DecodeMeta(b)
		if err != nil {
			t.Fatalf("DecodeMeta: %v", err)
		}
		if got.GRPCAddr != m.GRPCAddr || got.Version != m.Version || !got.StartTime.Equal(m.StartTime) || got.Leaving != m.Leaving {
			t.Fatalf("round trip %+v → %+v", m, got)
		}
	}
}

func TestEncodeMeta_RefusesWhatCannotBeAdvertised(t *testing.T) {
	start := time.Now()
	for name, m := range map[string]Meta{
		"too long":      {GRPCAddr: "10.0.0.1:9090", Version: strings.Repeat("v", MetaMaxSize), StartTime: start},
		"no port":       {GRPCAddr: "10.0.0.1", StartTime: start},
		"port 0":        {GRPCAddr: "10.0.0.1:0", StartTime: start},
		"no start time": {GRPCAddr: "10.0.0.1:9090"},
		"bad version":   {GRPCAddr: "10.0.0.1:9090", Version: "\xff", StartTime: start},
	} {
		if _, err := EncodeMeta(m); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: EncodeMeta = %v, want ErrBadMeta", name, err)
		}
	}
}

// A newer replica's meta (higher format, unknown fields) still decodes.
func TestDecodeMeta_SkipsFieldsOfNewerFormats(t *testing.T) {
	b, err := EncodeMeta(Meta{GRPCAddr: "10.0.0.1:9090", Version: "v2", StartTime: time.Unix(100, 0)})
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 7
	b = appendField(b, 99, []byte("shard-weights=1,2,3"))
	m, err := DecodeMeta(b)
	if err != nil || m.GRPCAddr != "10.0.0.1:9090" || m.Version != "v2" {
		t.Fatalf("DecodeMeta = %+v, %v", m, err)
	}
}

func TestDecodeMeta_RejectsGarbage(t *testing.T) {
	good, _ := EncodeMeta(Meta{GRPCAddr: "10.0.0.1:9090", StartTime: time.Unix(100, 0)})
	startField := appendField(nil, tagStartTime, binary.AppendUvarint(nil, 100))
	for name, b := range map[string][]byte{
		"empty":            nil,
		"format 0":         append([]byte{0}, good[1:]...),
		"truncated":        good[:len(good)-1],
		"huge length":      {1, tagGRPCAddr, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"bad varint":       {1, tagGRPCAddr, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"no gRPC address":  append([]byte{1}, startField...),
		"no start time":    appendField([]byte{1}, tagGRPCAddr, []byte("10.0.0.1:9090")),
		"repeated field":   append(append([]byte(nil), good...), appendField(nil, tagGRPCAddr, []byte("10.0.0.2:9090"))...),
		"bad address":      append(appendField([]byte{1}, tagGRPCAddr, []byte("nonsense")), startField...),
		"bad leaving flag": append(append([]byte(nil), good...), appendField(nil, tagLeaving, []byte{7})...),
		"too long":         append(append([]byte(nil), good...), appendField(nil, 99, bytes.Repeat([]byte{0}, MetaMaxSize))...),
		"json":             []byte(`{"grpc":"10.0.0.1:9090"}`),
	} {
		if m, err := DecodeMeta(b); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: DecodeMeta = %+v, %v; want ErrBadMeta", name, m, err)
		}
	}
}

// FuzzDecodeMeta: no input panics, and whatever decodes re-encodes to meta
// that decodes to the same value.
func FuzzDecodeMeta(f *testing.F) {
	good, _ := EncodeMeta(Meta{GRPCAddr: "10.0.0.1:9090", Version: "v1", StartTime: time.Unix(100, 5), Leaving: true})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0x80})
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		again, err := EncodeMeta(m)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", m, err)
		}
		m2, err := DecodeMeta(again)
		if err != nil || m2.GRPCAddr != m.GRPCAddr || m2.Version != m.Version || !m2.StartTime.Equal(m.StartTime) || m2.Leaving != m.Leaving {
			t.Fatalf("re-decoded %+v, %v; want %+v", m2, err, m)
		}
	})
}
