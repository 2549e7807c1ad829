package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
	"unicode/utf8"
)

// MetaMaxSize is memberlist's limit on a member's meta (memberlist.MetaMaxSize).
const MetaMaxSize = 512

// metaFormat is the version byte of the meta encoding written by this code.
// A decoder accepts any version ≥ 1: fields it does not know are skipped, so
// a newer replica's meta still yields the fields an older one needs.
const metaFormat = 1

// Field tags of the meta encoding. Tags are never reused.
const (
	tagGRPCAddr  = 1 // string
	tagVersion   = 2 // string
	tagStartTime = 3 // uvarint, Unix nanoseconds
	tagLeaving   = 4 // one byte, 0 or 1
)

// Meta is what a replica advertises about itself through gossip.
type Meta struct {
	// GRPCAddr is where other replicas reach this replica's gRPC service.
	GRPCAddr string
	// Version is the replica's build version (informational).
	Version string
	// StartTime is when the replica's process started.
	StartTime time.Time
	// Leaving is set just before a graceful leave, so that peers can tell
	// a shutdown from a failure and start a hand-over early.
	Leaving bool
}

// ErrBadMeta is returned (wrapped) by DecodeMeta for meta that is not a
// valid replica meta.
var ErrBadMeta = errors.New("bad member meta")

// EncodeMeta encodes m in the versioned wire format:
//
//	byte 0: format version (1)
//	then fields: tag (1 byte), length (uvarint), value
//
// It fails if the result would exceed MetaMaxSize.
func EncodeMeta(m Meta) ([]byte, error) {
	if err := checkAddr(m.GRPCAddr); err != nil {
		return nil, err
	}
	if m.StartTime.IsZero() || m.StartTime.UnixNano() <= 0 {
		return nil, fmt.Errorf("%w: start time %v is not after 1970", ErrBadMeta, m.StartTime)
	}
	if !utf8.ValidString(m.Version) {
		return nil, fmt.Errorf("%w: version is not UTF-8", ErrBadMeta)
	}
	buf := make([]byte, 0, 64)
	buf = append(buf, metaFormat)
	buf = appendField(buf, tagGRPCAddr, []byte(m.GRPCAddr))
	if m.Version != "" {
		buf = appendField(buf, tagVersion, []byte(m.Version))
	}
	buf = appendField(buf, tagStartTime, binary.AppendUvarint(nil, uint64(m.StartTime.UnixNano())))
	if m.Leaving {
		buf = appendField(buf, tagLeaving, []byte{1})
	}
	if len(buf) > MetaMaxSize {
		return nil, fmt.Errorf("%w: encoded meta is %d bytes, memberlist allows %d (shorten the gRPC address or version)", ErrBadMeta,
			len(buf), MetaMaxSize)
	}
	return buf, nil
}

func appendField(buf []byte, tag byte, val []byte) []byte {
	buf = append(buf, tag)
	buf = binary.AppendUvarint(buf, uint64(len(val)))
	return append(buf, val...)
}

// DecodeMeta decodes meta written by EncodeMeta of this or a newer format
// version. It never panics; anything malformed is an ErrBadMeta.
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, fmt.Errorf("%w: empty", ErrBadMeta)
	}
	if len(b) > MetaMaxSize {
		return m, fmt.Errorf("%w: %d bytes, more than %d", ErrBadMeta, len(b), MetaMaxSize)
	}
	if b[0] < 1 {
		return m, fmt.Errorf("%w: format version %d", ErrBadMeta, b[0])
	}
	seen := map[byte]bool{}
	rest := b[1:]
	for len(rest) > 0 {
		tag := rest[0]
		n, w := binary.Uvarint(rest[1:])
		if w <= 0 || n > uint64(len(rest)-1-w) {
			return Meta{}, fmt.Errorf("%w: truncated field %d", ErrBadMeta, tag)
		}
		val := rest[1+w : 1+w+int(n)]
		rest = rest[1+w+int(n):]
		if seen[tag] {
			return Meta{}, fmt.Errorf("%w: field %d repeated", ErrBadMeta, tag)
		}
		seen[tag] = true
		switch tag {
		case tagGRPCAddr:
			m.GRPCAddr = string(val)
		case tagVersion:
			if !utf8.Valid(val) {
				return Meta{}, fmt.Errorf("%w: version is not UTF-8", ErrBadMeta)
			}
			m.Version = string(val)
		case tagStartTime:
			ns, w := binary.Uvarint(val)
			if w != len(val) || ns == 0 || ns > 1<<63-1 {
				return Meta{}, fmt.Errorf("%w: bad start time", ErrBadMeta)
			}
			m.StartTime = time.Unix(0, int64(ns))
		case tagLeaving:
			if len(val) != 1 || val[0] > 1 {
				return Meta{}, fmt.Errorf("%w: bad leaving flag", ErrBadMeta)
			}
			m.Leaving = val[0] == 1
		default:
			// A field of a newer format: skip it.
		}
	}
	if !seen[tagGRPCAddr] || !seen[tagStartTime] {
		return Meta{}, fmt.Errorf("%w: gRPC address or start time missing", ErrBadMeta)
	}
	if err := checkAddr(m.GRPCAddr); err != nil {
		return Meta{}, err
	}
	return m, nil
}

func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: gRPC address %q: %w", ErrBadMeta, addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || host == "" || !utf8.ValidString(host) {
		return fmt.Errorf("%w: gRPC address %q is not host:port", ErrBadMeta, addr)
	}
	return nil
}
