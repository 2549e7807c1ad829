package datastore

import "testing"

// FuzzStore decodes the input bytes into a sequence of operations (the
// same ones as TestStore_Property, each byte one choice) and checks the
// invariants and the reference model after every step. Seeds live in
// testdata/fuzz/FuzzStore.
func FuzzStore(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00n\x02\x00\x04\x05\x00\x01\x02\x03\x08\x00\x00\x01\x0c\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{b: data}
		h := newHarness(t, src)
		for steps := 0; !src.done() && steps < 512; steps++ {
			h.step()
		}
	})
}
