package fleet

import (
	"io"
	"net"
	"sync"
)

// tcpProxy forwards every connection it accepts to a fixed address: how a
// replica inside a network namespace reaches kube-apiserver and bce-sim,
// which listen on the host's loopback only. TLS passes through untouched.
type tcpProxy struct {
	lis    net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newTCPProxy(listen, target string) (*tcpProxy, error) {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{
		lis:    lis,
		target: target,
		conns:  map[net.Conn]bool{},
	}
	p.wg.Go(p.serve)
	return p, nil
}

func (p *tcpProxy) addr() string { return p.lis.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Go(func() { p.pipe(c) })
	}
}

func (p *tcpProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false // closing
	}
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *tcpProxy) pipe(in net.Conn) {
	defer in.Close()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer out.Close()
	if !p.track(in, true) || !p.track(out, true) {
		return
	}
	defer p.track(in, false)
	defer p.track(out, false)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
	<-done
	// One direction ended: end both, so the other copy returns too.
	_ = in.Close()
	_ = out.Close()
	<-done
}

// close stops accepting, cuts every connection and waits for the pipes.
func (p *tcpProxy) close() {
	_ = p.lis.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
