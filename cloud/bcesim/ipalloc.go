package bcesim

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
)

// ipPool hands out IPv4 addresses of one subnet from a bitmap. It reserves the
// network address, the gateway (.1) and the broadcast address, as BCE does, so
// free() is exactly the subnet's availableIp.
type ipPool struct {
	prefix netip.Prefix
	base   uint32
	size   uint32
	used   []uint64
	free   int
	cursor uint32 // next-fit start, so a just-released address is not reused at once
}

var (
	errOutOfRange = errors.New("address outside the subnet")
	errInUse      = errors.New("address in use")
	errExhausted  = errors.New("subnet exhausted")
)

// Subnet sizes the simulator accepts: big enough for scale tests, small enough
// that a bitmap stays cheap.
const (
	minPrefixBits = 12
	maxPrefixBits = 29
)

func newIPPool(p netip.Prefix) (*ipPool, error) {
	if !p.IsValid() || !p.Addr().Is4() {
		return nil, fmt.Errorf("cidr %q must be an IPv4 prefix", p)
	}
	if p.Bits() < minPrefixBits || p.Bits() > maxPrefixBits {
		return nil, fmt.Errorf("cidr %s: prefix length must be between /%d and /%d", p, minPrefixBits, maxPrefixBits)
	}
	p = p.Masked()
	size := uint32(1) << (32 - p.Bits())
	pool := &ipPool{
		prefix: p,
		base:   addrToU32(p.Addr()),
		size:   size,
		used:   make([]uint64, (size+63)/64),
		free:   int(size) - 3,
		cursor: 2,
	}
	for _, off := range []uint32{0, 1, size - 1} {
		pool.set(off)
	}
	return pool, nil
}

func addrToU32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func u32ToAddr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (p *ipPool) set(off uint32)        { p.used[off/64] |= 1 << (off % 64) }
func (p *ipPool) clear(off uint32)      { p.used[off/64] &^= 1 << (off % 64) }
func (p *ipPool) isSet(off uint32) bool { return p.used[off/64]&(1<<(off%64)) != 0 }

func (p *ipPool) offset(a netip.Addr) (uint32, bool) {
	if !a.Is4() || !p.prefix.Contains(a) {
		return 0, false
	}
	return addrToU32(a) - p.base, true
}

func (p *ipPool) reserved(off uint32) bool { return off == 0 || off == 1 || off == p.size-1 }

// allocAny takes the next free address at or after the cursor.
func (p *ipPool) allocAny() (netip.Addr, error) {
	if p.free == 0 {
		return netip.Addr{}, errExhausted
	}
	words := uint32(len(p.used))
	start := p.cursor / 64
	for i := uint32(0); i <= words; i++ {
		w := (start + i) % words
		word := p.used[w]
		if i == 0 {
			// Ignore bits below the cursor on the first pass over the start word.
			word |= (uint64(1) << (p.cursor % 64)) - 1
		}
		if word == ^uint64(0) {
			continue
		}
		off := w*64 + uint32(bits.TrailingZeros64(^word))
		if off >= p.size {
			continue
		}
		p.set(off)
		p.free--
		p.cursor = (off + 1) % p.size
		return u32ToAddr(p.base + off), nil
	}
	return netip.Addr{}, errExhausted
}

func (p *ipPool) allocExact(a netip.Addr) error {
	off, ok := p.offset(a)
	if !ok {
		return errOutOfRange
	}
	if p.isSet(off) {
		return errInUse
	}
	p.set(off)
	p.free--
	return nil
}

// release frees a; it reports false for reserved or already free addresses.
func (p *ipPool) release(a netip.Addr) bool {
	off, ok := p.offset(a)
	if !ok || p.reserved(off) || !p.isSet(off) {
		return false
	}
	p.clear(off)
	p.free++
	return true
}

// usedAddrs lists the allocated, non-reserved addresses (for invariant checks).
func (p *ipPool) usedAddrs() []netip.Addr {
	var out []netip.Addr
	for off := uint32(0); off < p.size; off++ {
		if p.isSet(off) && !p.reserved(off) {
			out = append(out, u32ToAddr(p.base+off))
		}
	}
	return out
}
