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

func TestConfigRunsOnlyTheChosenItems(t *testing.T) {
	all := Config{}
	for _, it := range items {
		if !all.runs(it) {
			t.Errorf("a full run skips %q", it)
		}
	}
	only := Config{Items: []string{"failover", "scale"}}
	want := map[string]bool{"latency": false, "failover": true, "budget": false, "scale": true}
	for it, w := range want {
		if got := only.runs(it); got != w {
			t.Errorf("runs(%q) with items failover,scale = %v, want %v", it, got, w)
		}
	}
}
