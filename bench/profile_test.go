package bench

import "testing"

func TestCheckItemsRefusesUnknown(t *testing.T) {
	if err := CheckItems([]string{"latency", "scale"}); err != nil {
		t.Fatalf("known items refused: %v", err)
	}
	if err := CheckItems([]string{"latency", "memory"}); err == nil {
		t.Fatal(`unknown item "memory" accepted`)
	}
}

// The step names in runAll start with their item numbers; a partial run
// picks steps by those prefixes.
func TestConfigRunsPicksStepsByItem(t *testing.T) {
	steps := []string{"1 warm allocation", "2 failover", "5 budget", "3, 4, 6 at 1000 nodes x 30 pods"}
	all := Config{}
	for _, s := range steps {
		if !all.runs(s) {
			t.Errorf("a full run skips %q", s)
		}
	}
	only := Config{Items: []string{"failover", "scale"}}
	want := map[string]bool{steps[0]: false, steps[1]: true, steps[2]: false, steps[3]: true}
	for s, w := range want {
		if got := only.runs(s); got != w {
			t.Errorf("runs(%q) with items failover,scale = %v, want %v", s, got, w)
		}
	}
}
