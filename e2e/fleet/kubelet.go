package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cce-ipam/sharded/e2e/kubeletsim"
)

// kubeletConfig is the simulator's config: see Options.Kubelet.
func (f *Fleet) kubeletConfig() kubeletsim.Config {
	c := kubeletsim.DefaultConfig()
	c.Workers = 16
	c.CNITimeout = 15 * time.Second
	c.RetryBase, c.RetryMax = 200*time.Millisecond, 5*time.Second
	c.NodeLeasePeriod = 10 * time.Second
	if f.opts.Kubelet != nil {
		f.opts.Kubelet(&c)
	}
	c.Name = f.SimulatorName()
	c.ClusterID, c.VPCID, c.SubnetID, c.Zone = f.ClusterID, f.VPCID, f.SubnetID, Zone
	c.SecurityGroupIDs = []string{f.SecurityGroup}
	c.InstanceCPUs, c.InstanceMemoryGB = f.opts.InstanceCPUs, f.opts.InstanceMemoryGB
	c.IPPool = true
	c.CNIEndpoint, c.CNIEndpoints = "", f.CNIAddrs()
	return c
}

// Kubelet returns the running kubelet simulator (nil with NoKubelet or
// before it started); read its Stats for counters. RestartKubelet replaces
// it.
func (f *Fleet) Kubelet() *kubeletsim.Simulator {
	f.kubeletMu.Lock()
	defer f.kubeletMu.Unlock()
	return f.kubelet
}

// RestartKubelet stops the kubelet simulator and starts a new one that
// spreads its CNI calls over the current CNIAddrs (after AddReplica or
// RemoveReplica). The new simulator picks the pods' sandboxes up from their
// status, as a restarted kubelet does. Its counters start from zero.
func (f *Fleet) RestartKubelet() error {
	if err := f.stopKubelet(); err != nil {
		return err
	}
	return f.startKubelet()
}

func (f *Fleet) startKubelet() error {
	f.kubeletMu.Lock()
	defer f.kubeletMu.Unlock()
	if f.kubeletLog == nil {
		out, err := os.OpenFile(filepath.Join(f.Dir, "kubelet-sim.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		f.kubeletLogOut = out
		level := slog.LevelInfo
		if f.opts.KubeletDebug {
			level = slog.LevelDebug
		}
		f.kubeletLog = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
	}
	if len(f.CNIAddrs()) == 0 {
		return errors.New("fleet: no replica to send CNI calls to")
	}
	sim, err := kubeletsim.New(f.kubeletConfig(), kubeletsim.Deps{Kube: f.Kube, CCE: f.CCE,
		Instances: kubeletsim.AdminInstances(f.simURL, nil), ENIs: f.Cloud}, f.kubeletLog, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx) }()
	select {
	case <-sim.Synced():
	case err := <-done:
		cancel()
		return fmt.Errorf("fleet: kubelet simulator: %w", err)
	case <-time.After(time.Minute):
		cancel()
		return errors.Join(errors.New("fleet: kubelet simulator's informers did not sync within a minute"), <-done)
	}
	f.kubelet, f.kubeletStop, f.kubeletDone = sim, cancel, done
	return nil
}

func (f *Fleet) stopKubelet() error {
	f.kubeletMu.Lock()
	defer f.kubeletMu.Unlock()
	if f.kubeletStop == nil {
		return nil
	}
	f.kubeletStop()
	err := <-f.kubeletDone
	f.kubeletStop, f.kubeletDone = nil, nil
	if err != nil {
		return fmt.Errorf("fleet: kubelet simulator: %w", err)
	}
	return nil
}
