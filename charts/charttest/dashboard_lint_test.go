package charttest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The rules of Grafana's dashboard linter (github.com/grafana/dashboard-linter)
// that apply to a Prometheus dashboard, written out over the JSON of
// dashboards/cce-ipam.json. The linter itself is not a dependency: its rules
// are small, and here each one also has a broken dashboard that it must
// refuse, so a rule that checks nothing fails the test. target-promql-rule
// (every query parses) is left to TestChart_FleetUnderPrometheus, which runs
// every query against a real Prometheus.
//
// No build tag: the test reads a file only, so it runs in the unit tests too.

// lintDashboard is the dashboard JSON as plain maps, so that the broken
// variants below can change any field.
type lintDashboard = map[string]any

type lintRule struct {
	name  string
	check func(d lintDashboard) []string
	// breaks changes a valid dashboard so that check must report it.
	breaks func(d lintDashboard)
}

var dashboardRules = []lintRule{
	{
		name: "template-datasource-rule: a datasource variable of type prometheus",
		check: func(d lintDashboard) []string {
			v := variable(d, "datasource")
			if v == nil || v["type"] != "datasource" || v["query"] != "prometheus" {
				return []string{fmt.Sprintf("no variable datasource of type datasource, query prometheus: %v", v)}
			}
			return nil
		},
		breaks: func(d lintDashboard) { variable(d, "datasource")["query"] = "loki" },
	},
	{
		name: "template-job-rule: job is a multi-select query variable with All",
		check: func(d lintDashboard) []string {
			return checkSelectVariable(d, "job", false)
		},
		breaks: func(d lintDashboard) { variable(d, "job")["multi"] = false },
	},
	{
		name: "template-instance-rule: instance is a multi-select query variable with All",
		check: func(d lintDashboard) []string {
			return checkSelectVariable(d, "instance", false)
		},
		breaks: func(d lintDashboard) { variable(d, "instance")["includeAll"] = false },
	},
	{
		name: "cluster variable: label cluster, optional (All matches series without it)",
		check: func(d lintDashboard) []string {
			return checkSelectVariable(d, "cluster", true)
		},
		breaks: func(d lintDashboard) { delete(variable(d, "cluster"), "allValue") },
	},
	{
		name: "template variables have the datasource variable as datasource",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, v := range variables(d) {
				if v["type"] == "query" && !isDatasourceVar(v["datasource"]) {
					errs = append(errs, fmt.Sprintf("variable %v: datasource %v, want ${datasource}", v["name"], v["datasource"]))
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) { delete(variable(d, "instance"), "datasource") },
	},
	{
		name: "template-on-time-change-reload-rule: query variables refresh on time range change",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, v := range variables(d) {
				if v["type"] == "query" && v["refresh"] != float64(2) {
					errs = append(errs, fmt.Sprintf("variable %v: refresh %v, want 2", v["name"], v["refresh"]))
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) { variable(d, "job")["refresh"] = float64(1) },
	},
	{
		name: "template-label-promql-rule: query variables are label_values(selector, label)",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, v := range variables(d) {
				if v["type"] != "query" {
					continue
				}
				q, _ := v["query"].(map[string]any)
				s, _ := q["query"].(string)
				if m := labelValues.FindStringSubmatch(strings.TrimSpace(s)); m == nil || m[2] != v["name"] {
					errs = append(errs, fmt.Sprintf("variable %v: query %q is not label_values(selector, %v)", v["name"], s, v["name"]))
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) {
			variable(d, "job")["query"] = map[string]any{"query": "query_result(up)", "refId": "job"}
		},
	},
	{
		name: "template-uneditable-rule: the dashboard is not editable",
		check: func(d lintDashboard) []string {
			if d["editable"] != false {
				return []string{fmt.Sprintf("editable %v, want false", d["editable"])}
			}
			return nil
		},
		breaks: func(d lintDashboard) { d["editable"] = true },
	},
	{
		name: "panel-datasource-rule: panels and targets use the datasource variable",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, p := range panels(d) {
				if p["type"] == "row" {
					continue
				}
				if !isDatasourceVar(p["datasource"]) {
					errs = append(errs, fmt.Sprintf("panel %q: datasource %v", p["title"], p["datasource"]))
				}
				for _, tg := range targets(p) {
					if ds, ok := tg["datasource"]; ok && !isDatasourceVar(ds) {
						errs = append(errs, fmt.Sprintf("panel %q target %v: datasource %v", p["title"], tg["refId"], ds))
					}
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) {
			panels(d)[1]["datasource"] = map[string]any{"type": "prometheus", "uid": "prometheus-prod"}
		},
	},
	{
		name: "panel-title-description-rule: panels have a title and a description",
		check: func(d lintDashboard) []string {
			var errs []string
			for i, p := range panels(d) {
				if t, _ := p["title"].(string); strings.TrimSpace(t) == "" {
					errs = append(errs, fmt.Sprintf("panel %d (id %v) has no title", i, p["id"]))
				}
				if p["type"] == "row" {
					continue
				}
				if s, _ := p["description"].(string); strings.TrimSpace(s) == "" {
					errs = append(errs, fmt.Sprintf("panel %q has no description", p["title"]))
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) { panels(d)[2]["title"] = " " },
	},
	{
		name: "panel-units-rule: panels have a unit",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, p := range panels(d) {
				if p["type"] == "row" {
					continue
				}
				fc, _ := p["fieldConfig"].(map[string]any)
				def, _ := fc["defaults"].(map[string]any)
				if u, _ := def["unit"].(string); u == "" {
					errs = append(errs, fmt.Sprintf("panel %q has no unit", p["title"]))
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) {
			delete(panels(d)[1]["fieldConfig"].(map[string]any)["defaults"].(map[string]any), "unit")
		},
	},
	{
		name: "panel-no-targets-rule: panels have queries",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, p := range panels(d) {
				if p["type"] == "row" {
					continue
				}
				if len(targets(p)) == 0 {
					errs = append(errs, fmt.Sprintf("panel %q has no targets", p["title"]))
				}
				for _, tg := range targets(p) {
					if e, _ := tg["expr"].(string); strings.TrimSpace(e) == "" {
						errs = append(errs, fmt.Sprintf("panel %q target %v has no expr", p["title"], tg["refId"]))
					}
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) { panels(d)[1]["targets"] = []any{} },
	},
	{
		name: "target-job-rule, target-instance-rule and the cluster: every selector uses the variables",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, q := range lintQueries(d) {
				for _, e := range selectorErrors(q.expr, selectorVars) {
					errs = append(errs, fmt.Sprintf("%s: %s", q.panel, e))
				}
			}
			// A variable's values follow the variables before it.
			for name, vars := range map[string][]string{"job": selectorVars[:1], "instance": selectorVars[:2]} {
				if v := variable(d, name); v != nil {
					for _, e := range selectorErrors(variableSelector(v), vars) {
						errs = append(errs, fmt.Sprintf("variable %s: %s", name, e))
					}
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) {
			tg := targets(panels(d)[1])[0]
			tg["expr"] = strings.Replace(tg["expr"].(string), `cluster=~"$cluster",`, "", 1)
		},
	},
	{
		name: "target-rate-interval-rule: rate, irate and increase use $__rate_interval",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, q := range lintQueries(d) {
				for _, call := range rangeCalls(q.expr) {
					ranges := rangeSelector.FindAllString(q.expr[call[0]:call[1]], -1)
					if len(ranges) == 0 || slices.ContainsFunc(ranges, func(r string) bool { return r != "[$__rate_interval]" }) {
						errs = append(errs, fmt.Sprintf("%s: %s uses %v, want [$__rate_interval]", q.panel, q.expr[call[0]:call[1]], ranges))
					}
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) {
			for _, p := range panels(d) {
				for _, tg := range targets(p) {
					tg["expr"] = strings.ReplaceAll(tg["expr"].(string), "[$__rate_interval]", "[5m]")
				}
			}
		},
	},
	{
		name: "target-counter-agg-rule: counters only inside rate, irate or increase",
		check: func(d lintDashboard) []string {
			var errs []string
			for _, q := range lintQueries(d) {
				calls := rangeCalls(q.expr)
				for _, m := range counterName.FindAllStringIndex(q.expr, -1) {
					if !slices.ContainsFunc(calls, func(c [2]int) bool { return c[0] <= m[0] && m[1] <= c[1] }) {
						errs = append(errs, fmt.Sprintf("%s: counter %s outside rate/irate/increase", q.panel, q.expr[m[0]:m[1]]))
					}
				}
			}
			return errs
		},
		breaks: func(d lintDashboard) {
			tg := targets(panels(d)[1])[0]
			tg["expr"] = `sum(cce_ipam_fenced_writes_total{cluster=~"$cluster",job=~"$job",instance=~"$instance"})`
		},
	},
	{
		name: "uids: the dashboard uid is set; panel ids, variable names and refIds are unique",
		check: func(d lintDashboard) []string {
			var errs []string
			if uid, _ := d["uid"].(string); uid == "" {
				errs = append(errs, "dashboard has no uid")
			}
			ids := map[float64]bool{}
			for _, p := range panels(d) {
				id, _ := p["id"].(float64)
				if id == 0 || ids[id] {
					errs = append(errs, fmt.Sprintf("panel %q: id %v missing or reused", p["title"], p["id"]))
				}
				ids[id] = true
				refs := map[any]bool{}
				for _, tg := range targets(p) {
					if tg["refId"] == nil || refs[tg["refId"]] {
						errs = append(errs, fmt.Sprintf("panel %q: refId %v missing or reused", p["title"], tg["refId"]))
					}
					refs[tg["refId"]] = true
				}
			}
			names := map[any]bool{}
			for _, v := range variables(d) {
				if names[v["name"]] {
					errs = append(errs, fmt.Sprintf("variable %v defined twice", v["name"]))
				}
				names[v["name"]] = true
			}
			return errs
		},
		breaks: func(d lintDashboard) { panels(d)[2]["id"] = panels(d)[1]["id"] },
	},
}

func TestDashboard_Lint(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "cce-ipam", "dashboards", "cce-ipam.json")) // chartDir is integration-only
	if err != nil {
		t.Fatal(err)
	}
	parse := func() lintDashboard {
		var d lintDashboard
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("dashboard JSON: %v", err)
		}
		return d
	}
	if n := len(lintQueries(parse())); n < 40 {
		t.Fatalf("only %d queries found in the dashboard", n)
	}
	for _, r := range dashboardRules {
		t.Run(r.name, func(t *testing.T) {
			for _, e := range r.check(parse()) {
				t.Error(e)
			}
			broken := parse()
			r.breaks(broken)
			if len(r.check(broken)) == 0 {
				t.Error("the rule accepts a dashboard broken for it: it checks nothing")
			}
		})
	}
}

// checkSelectVariable checks a query variable over a label: multi-select with
// All, the datasource variable, and (optional) an All that matches series
// without the label.
func checkSelectVariable(d lintDashboard, name string, optional bool) []string {
	v := variable(d, name)
	if v == nil {
		return []string{"no variable " + name}
	}
	var errs []string
	if v["type"] != "query" {
		errs = append(errs, fmt.Sprintf("%s: type %v, want query", name, v["type"]))
	}
	if v["multi"] != true || v["includeAll"] != true {
		errs = append(errs, fmt.Sprintf("%s: multi %v includeAll %v, want a multi-select with All", name, v["multi"], v["includeAll"]))
	}
	if optional && v["allValue"] != ".*" {
		errs = append(errs, fmt.Sprintf("%s: allValue %v, want .* (matches series without the label)", name, v["allValue"]))
	}
	if name == "job" && v["allValue"] == ".*" {
		// .* would also match other jobs' up, process_* and go_* series (instance's
		// .* is bounded by the job matcher beside it).
		errs = append(errs, fmt.Sprintf("%s: allValue .* widens All beyond the listed values", name))
	}
	return errs
}

func variables(d lintDashboard) []map[string]any {
	tm, _ := d["templating"].(map[string]any)
	list, _ := tm["list"].([]any)
	var out []map[string]any
	for _, v := range list {
		if m, ok := v.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func variable(d lintDashboard, name string) map[string]any {
	for _, v := range variables(d) {
		if v["name"] == name {
			return v
		}
	}
	return nil
}

// panels returns every panel, those nested in collapsed rows included, in order.
func panels(d lintDashboard) []map[string]any {
	var out []map[string]any
	var walk func(any)
	walk = func(ps any) {
		list, _ := ps.([]any)
		for _, p := range list {
			if m, ok := p.(map[string]any); ok {
				out = append(out, m)
				walk(m["panels"])
			}
		}
	}
	walk(d["panels"])
	return out
}

func targets(p map[string]any) []map[string]any {
	list, _ := p["targets"].([]any)
	var out []map[string]any
	for _, t := range list {
		if m, ok := t.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func isDatasourceVar(ds any) bool {
	switch ds := ds.(type) {
	case string:
		return ds == "$datasource" || ds == "${datasource}"
	case map[string]any:
		return ds["uid"] == "$datasource" || ds["uid"] == "${datasource}"
	}
	return false
}

type lintQuery struct{ panel, expr string }

// lintQueries returns the PromQL of every panel target.
func lintQueries(d lintDashboard) []lintQuery {
	var out []lintQuery
	for _, p := range panels(d) {
		for _, tg := range targets(p) {
			e, _ := tg["expr"].(string)
			out = append(out, lintQuery{fmt.Sprintf("panel %q", p["title"]), e})
		}
	}
	return out
}

// variableSelector returns the selector of a label_values(selector, label) variable.
func variableSelector(v map[string]any) string {
	q, _ := v["query"].(map[string]any)
	if m := labelValues.FindStringSubmatch(strings.TrimSpace(fmt.Sprint(q["query"]))); m != nil {
		return m[1]
	}
	return ""
}

var (
	labelValues   = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	rangeSelector = regexp.MustCompile(`\[[^\]]*\]`)
	counterName   = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*(_total|_count|_sum|_bucket)\b`)
	rangeFunc     = regexp.MustCompile(`\b(rate|irate|increase)\s*\(`)
	// Grouping clauses list labels, not metrics.
	grouping   = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// The variables each vector selector must use, so that a query never reads
// another cluster's, job's or replica's series.
var selectorVars = []string{`cluster=~"$cluster"`, `job=~"$job"`, `instance=~"$instance"`}

// promqlWords are identifiers of PromQL that are not metric names.
var promqlWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true}

// selectorErrors reports vector selectors of expr without the variables: a
// metric name must be followed by {…} holding every one of vars.
// A regular expression cannot parse PromQL in general; it is enough for
// this dashboard's queries (names, label matchers, calls, grouping, numbers).
func selectorErrors(expr string, vars []string) []string {
	var errs []string
	rest := grouping.ReplaceAllString(expr, "")
	for {
		loc := identifier.FindStringIndex(rest)
		if loc == nil {
			return errs
		}
		name, after := rest[loc[0]:loc[1]], strings.TrimLeft(rest[loc[1]:], " ")
		if loc[0] > 0 && (rest[loc[0]-1] >= '0' && rest[loc[0]-1] <= '9' || rest[loc[0]-1] == '.' || rest[loc[0]-1] == '$') {
			// part of a number (1e3) or a Grafana variable
			rest = rest[loc[1]:]
			continue
		}
		switch {
		case strings.HasPrefix(after, "("), promqlWords[name]:
			rest = after
		case strings.HasPrefix(after, "{"):
			end := strings.Index(after, "}")
			if end < 0 {
				return append(errs, fmt.Sprintf("%s: unclosed selector", name))
			}
			for _, v := range vars {
				if !strings.Contains(after[:end], v) {
					errs = append(errs, fmt.Sprintf("%s%s lacks %s", name, after[:end+1], v))
				}
			}
			rest = after[end+1:]
		default:
			errs = append(errs, fmt.Sprintf("%s has no label selector (wants %s)", name, strings.Join(vars, ",")))
			rest = after
		}
	}
}

// rangeCalls returns the spans [start, end) of every rate(…), irate(…) and
// increase(…) call of expr, matched by parentheses.
func rangeCalls(expr string) [][2]int {
	var out [][2]int
	for _, m := range rangeFunc.FindAllStringIndex(expr, -1) {
		depth := 0
		for i := m[1] - 1; i < len(expr); i++ {
			switch expr[i] {
			case '(':
				depth++
			case ')':
				depth--
			}
			if depth == 0 {
				out = append(out, [2]int{m[0], i + 1})
				break
			}
		}
	}
	return out
}
