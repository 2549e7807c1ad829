package pool

import (
	"errors"
	"fmt"
	"strconv"
)

// Node annotations written by the node agent (see the reference spec §2).
const (
	AnnotationMaxIPPerENI       = "cce.io/max-ip-per-eni"
	AnnotationMaxENINum         = "cce.io/max-eni-num"
	AnnotationWarmIPTarget      = "cce.io/warm-ip-target"
	AnnotationPreAttachedENINum = "cce.io/pre-attached-eni-num"
)

// MaxIPsPerCall is the most addresses one BatchAddPrivateIP call may add.
const MaxIPsPerCall = 10

// Capacity is what a node can hold.
type Capacity struct {
	// MaxIPsPerENI counts the primary address too (the annotation's
	// meaning), so an ENI holds MaxIPsPerENI-1 pod addresses.
	MaxIPsPerENI int
	// MaxENIs is the most ENIs the node may have attached.
	MaxENIs int
	// WarmIPTarget: when the spare room on attached ENIs falls below this
	// many addresses, another ENI is wanted.
	WarmIPTarget int
	// PreAttachedENIs is how many ENIs a node gets regardless of demand.
	PreAttachedENIs int
	// AheadOfDemand: the node asks for ENIs ahead of demand (it carries
	// AnnotationPreAttachedENINum or AnnotationWarmIPTarget, as the node
	// agent writes them), so the ENI sync creates them before the pool
	// runs dry (spec §7.2.4). Without it an ENI is only created when the
	// pool cannot grow.
	AheadOfDemand bool
}

// DefaultCapacity is used for annotations that are missing: an 8-32 GB
// node with 8 CPUs as the node agent would describe it.
func DefaultCapacity() Capacity {
	return Capacity{
		MaxIPsPerENI:    16,
		MaxENIs:         8,
		WarmIPTarget:    8,
		PreAttachedENIs: 1,
	}
}

// Validate checks a capacity.
func (c Capacity) Validate() error {
	switch {
	case c.MaxIPsPerENI < 2:
		return fmt.Errorf("max ips per eni %d: need at least 2 (primary + one)", c.MaxIPsPerENI)
	case c.MaxENIs < 1:
		return fmt.Errorf("max enis %d: need at least 1", c.MaxENIs)
	case c.WarmIPTarget < 0:
		return fmt.Errorf("negative warm ip target %d", c.WarmIPTarget)
	case c.PreAttachedENIs < 0:
		return fmt.Errorf("negative pre-attached eni count %d", c.PreAttachedENIs)
	}
	return nil
}

// CapacityFromAnnotations reads a node's capacity annotations. A missing
// annotation takes its value from def; a missing warm-ip-target is half of
// max-ip-per-eni, as the node agent writes it. A malformed or out-of-range
// annotation also falls back to the default, and is reported in the error,
// so one bad node never stops planning for the others (the reference
// aborted its whole loop). The returned Capacity is always usable.
func CapacityFromAnnotations(ann map[string]string, def Capacity) (Capacity, error) {
	var errs []error
	read := func(key string, dflt, lowest int) int {
		s, ok := ann[key]
		if !ok {
			return dflt
		}
		v, err := strconv.Atoi(s)
		if err != nil || v < lowest {
			errs = append(errs, fmt.Errorf("annotation %s=%q: want an integer >= %d, using %d", key, s, lowest, dflt))
			return dflt
		}
		return v
	}
	c := Capacity{
		MaxIPsPerENI:    read(AnnotationMaxIPPerENI, def.MaxIPsPerENI, 2),
		MaxENIs:         read(AnnotationMaxENINum, def.MaxENIs, 1),
		PreAttachedENIs: read(AnnotationPreAttachedENINum, def.PreAttachedENIs, 0),
	}
	warm := def.WarmIPTarget
	if _, ok := ann[AnnotationMaxIPPerENI]; ok {
		warm = c.MaxIPsPerENI / 2
	}
	c.WarmIPTarget = read(AnnotationWarmIPTarget, warm, 0)
	_, pre := ann[AnnotationPreAttachedENINum]
	_, warmSet := ann[AnnotationWarmIPTarget]
	c.AheadOfDemand = pre || warmSet
	return c, errors.Join(errs...)
}
