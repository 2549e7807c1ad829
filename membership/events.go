package membership

import (
	"bytes"
	"context"
	"log/slog"
	"sync"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// EventType says what happened to a member.
type EventType int

const (
	// EventJoin: the member became live (first seen, or back after a leave).
	EventJoin EventType = iota + 1
	// EventUpdate: a live member's meta changed (e.g. Leaving was set).
	EventUpdate
	// EventLeave: the member is gone, gracefully (Event.Failed false) or
	// declared dead by the failure detector (Event.Failed true).
	EventLeave
)

func (t EventType) String() string {
	switch t {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	}
	return "unknown"
}

// Event is one membership change.
type Event struct {
	// Seq numbers the events of one Membership 1, 2, 3, … without gaps.
	Seq  uint64
	Type EventType
	// Member is the member as of this change; for a leave, as last known.
	Member Member
	// Failed is set on a leave that was not announced: the member crashed,
	// was partitioned away or shut down without Leave. It is a hint (a
	// leave whose announcement got lost also counts as failed).
	Failed bool
}

// eventQueue is an unbounded FIFO between memberlist's delegate calls (made
// one at a time, under memberlist's node lock, from its goroutines) and the
// single dispatch goroutine. push never blocks.
type eventQueue struct {
	mu     sync.Mutex
	seq    uint64
	items  []Event
	signal chan struct{}    // capacity 1: "items may be non-empty"
	length prometheus.Gauge // set under mu, so it ends at the true length
}

func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	q.seq++
	ev.Seq = q.seq
	q.items = append(q.items, ev)
	q.length.Set(float64(len(q.items)))
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *eventQueue) pop() (Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return Event{}, false
	}
	ev := q.items[0]
	q.items[0] = Event{}
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let the backing array go
	}
	q.length.Set(float64(len(q.items)))
	return ev, true
}

// dispatch hands queued events to the consumer, one at a time, in order.
func (m *Membership) dispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.queue.signal:
		}
		for {
			ev, ok := m.queue.pop()
			if !ok {
				break
			}
			label := ev.Type.String()
			if ev.Type == EventLeave && ev.Failed {
				label = "fail"
			}
			m.metrics.events.WithLabelValues(label).Inc()
			select {
			case m.events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}
}

// delegate receives memberlist's callbacks. They run on memberlist's
// goroutines, some under its node lock: they must not block and must not
// call back into memberlist.
type delegate struct{ m *Membership }

// NodeMeta implements memberlist.Delegate.
func (d *delegate) NodeMeta(limit int) []byte {
	b := *d.m.meta.Load()
	if len(b) > limit {
		return nil // cannot happen: EncodeMeta enforces MetaMaxSize
	}
	return b
}

// NotifyMsg implements memberlist.Delegate; no user messages are used.
func (d *delegate) NotifyMsg([]byte) {}

// GetBroadcasts implements memberlist.Delegate.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState implements memberlist.Delegate.
func (d *delegate) LocalState(join bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {}

// NotifyAlive implements memberlist.AliveDelegate: a peer whose meta is not
// a valid replica meta (garbage, another application on the port) is never
// admitted, and a live member's update to such meta is ignored.
func (d *delegate) NotifyAlive(peer *memberlist.Node) error {
	if _, err := DecodeMeta(peer.Meta); err != nil {
		d.m.metrics.metaRejected.Inc()
		return err
	}
	return nil
}

// NotifyJoin implements memberlist.EventDelegate.
func (d *delegate) NotifyJoin(n *memberlist.Node) { d.enqueue(EventJoin, n) }

// NotifyUpdate implements memberlist.EventDelegate.
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.enqueue(EventUpdate, n) }

// NotifyLeave implements memberlist.EventDelegate.
func (d *delegate) NotifyLeave(n *memberlist.Node) { d.enqueue(EventLeave, n) }

func (d *delegate) enqueue(t EventType, n *memberlist.Node) {
	meta, err := DecodeMeta(n.Meta)
	if err != nil && t != EventLeave {
		// NotifyAlive keeps such peers out; should one slip through, it
		// still never becomes a member.
		d.m.metrics.metaRejected.Inc()
		return
	}
	ev := Event{Type: t, Member: Member{Name: n.Name, Addr: n.Address(), Meta: meta}}
	if t == EventLeave {
		ev.Failed = !meta.Leaving
	}
	if d.m.track(&ev.Type, ev.Member) {
		d.m.queue.push(ev)
	}
}

// logWriter turns memberlist's "[LEVEL] memberlist: text" lines into slog
// records.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, l := range []struct {
		prefix string
		level  slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelError}, {"[ERROR]",
		slog.LevelError}} {
		if bytes.HasPrefix(line, []byte(l.prefix)) {
			level = l.level
			line = bytes.TrimSpace(line[len(l.prefix):])
			break
		}
	}
	w.log.Log(context.Background(), level, string(line))
	return len(p), nil
}
