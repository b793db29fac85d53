package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
)

// openAPI is the part of api/openapi.yaml the tests read.
type openAPI struct {
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas map[string]*oaSchema `yaml:"schemas"`
	} `yaml:"components"`
}

type oaSchema struct {
	Ref        string               `yaml:"$ref"`
	Properties map[string]*oaSchema `yaml:"properties"`
	AllOf      []*oaSchema          `yaml:"allOf"`
}

func loadOpenAPI(t *testing.T) *openAPI {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("parse api/openapi.yaml: %v", err)
	}
	return &doc
}

var (
	httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options"}
	// pathParam matches a path wildcard, {id} or {rest...}: its name is
	// not part of a route's identity.
	pathParam = regexp.MustCompile(`\{[^}]*\}`)
)

// routeKey is "METHOD /path" with every wildcard written {}.
func routeKey(method, path string) string {
	return strings.ToUpper(method) + " " + pathParam.ReplaceAllString(path, "{}")
}

// agentProcRoutes reads the routes the in-sandbox agent registers under
// /procs/ from its source (the agent cannot be started in a unit test).
// The control plane's /v1/sandboxes/{id}/processes/{rest...} passes every
// request on to them (see Server.processes).
func agentProcRoutes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../agent/server.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var routes []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		lit, isLit := call.Args[0].(*ast.BasicLit)
		if !ok || !isLit || lit.Kind != token.STRING || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
			return true
		}
		pattern, err := strconv.Unquote(lit.Value)
		if err != nil {
			t.Fatal(err)
		}
		method, path, ok := strings.Cut(pattern, " ")
		if ok && strings.HasPrefix(path, "/procs/") {
			routes = append(routes, routeKey(method, "/v1/sandboxes/{id}/processes"+strings.TrimPrefix(path, "/procs")))
		}
		return true
	})
	if len(routes) == 0 {
		t.Fatal("found no /procs/ routes in internal/agent/server.go: has the agent's router moved?")
	}
	return routes
}

// serverRoutes are the routes Handler registers, as routeKeys, with the
// pass-through to the agent's process routes expanded.
func serverRoutes(t *testing.T) []string {
	t.Helper()
	mux, ok := New(Config{Logger: slog.New(slog.DiscardHandler)}).Handler().(*routeMux)
	if !ok {
		t.Fatal("Handler no longer returns a *routeMux")
	}
	var routes []string
	for _, p := range mux.patterns {
		method, path, ok := strings.Cut(p, " ")
		switch {
		case p == "/":
			// The catch-all that answers 404 for everything else.
		case !ok && p == "/v1/sandboxes/{id}/processes/{rest...}":
			routes = append(routes, agentProcRoutes(t)...)
		case !ok && p == "/v1/sandboxes/{id}/ports/{port}/{path...}":
			// The port proxy passes every method on; these are documented.
			for _, m := range []string{"get", "post", "put", "patch", "delete"} {
				routes = append(routes, routeKey(m, p))
			}
		case !ok:
			t.Errorf("route %q takes every method: add it to this test with what it serves", p)
		default:
			routes = append(routes, routeKey(method, path))
		}
	}
	return routes
}

// TestOpenAPIRoutes holds the routes the server serves against the paths
// of api/openapi.yaml: each must be documented, and nothing documented may
// be missing from the server.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	documented := map[string]bool{}
	for path, item := range doc.Paths {
		for method := range item {
			if slices.Contains(httpMethods, method) {
				documented[routeKey(method, path)] = true
			}
		}
	}
	served := map[string]bool{}
	for _, r := range serverRoutes(t) {
		served[r] = true
	}
	for _, r := range sortedKeys(served) {
		if !documented[r] {
			t.Errorf("the server serves %s, which api/openapi.yaml does not document", r)
		}
	}
	for _, r := range sortedKeys(documented) {
		if !served[r] {
			t.Errorf("api/openapi.yaml documents %s, which the server does not serve", r)
		}
	}
}

// TestOpenAPISchemas holds the properties of api/openapi.yaml's schemas
// against the JSON names of the Go types they describe.
func TestOpenAPISchemas(t *testing.T) {
	doc := loadOpenAPI(t)
	types := map[string]any{
		"Error": api.Error{}, "ErrorResponse": api.ErrorResponse{},
		"LayerRefs": api.LayerRefs{}, "Resources": api.Resources{}, "Network": api.Network{},
		"BatchCreateRequest": api.BatchCreateRequest{}, "BatchItem": api.BatchItem{},
		"BatchResult": api.BatchResult{}, "BatchEvent": api.BatchEvent{}, "BatchProgress": api.BatchProgress{},
		"FnCallRequest": api.FnCallRequest{}, "FnCallWarmRequest": api.FnCallWarmRequest{},
		"FnCallPool": api.FnCallPool{}, "FnCallPoolList": api.FnCallPoolList{},
		"Phase": api.Phase{}, "FileRules": api.FileRules{}, "SetPhaseRequest": api.SetPhaseRequest{},
		"Profile": api.Profile{}, "CreateSandboxRequest": api.CreateSandboxRequest{},
		"Sandbox": api.Sandbox{}, "Display": api.Display{}, "InputAction": api.InputAction{}, "InputRequest": api.InputRequest{}, "InputResult": api.InputResult{}, "RenewRequest": api.RenewRequest{}, "SandboxList": api.SandboxList{},
		"Trajectory": api.Trajectory{}, "Checkpoint": api.Checkpoint{}, "RestoreRequest": api.RestoreRequest{},
		"RestoreResult": api.RestoreResult{}, "TrajectoryStep": api.TrajectoryStep{},
		"TrajectoryLog": api.TrajectoryLog{}, "ExecRequest": api.ExecRequest{}, "ExecResult": api.ExecResult{},
		"ExecEvent": api.ExecEvent{}, "Process": api.Process{}, "ProcessList": api.ProcessList{},
		"TTYSize": api.TTYSize{}, "TerminalMessage": api.TerminalMessage{},
		"OutputEvent": api.OutputEvent{}, "PortURLRequest": api.PortURLRequest{}, "PortURL": api.PortURL{},
		"FileInfo": api.FileInfo{}, "FileList": api.FileList{}, "FileWritten": api.FileWritten{},
		"Layer": api.Layer{}, "SnapshotRequest": api.SnapshotRequest{}, "LayerList": api.LayerList{},
		"ForkRequest": api.ForkRequest{}, "ForkResult": api.ForkResult{},
		"LayerConfig": api.LayerConfig{}, "BuildEvent": api.BuildEvent{}, "BuildStep": api.BuildStep{},
		"BuildOutput": api.BuildOutput{}, "BuildResult": api.BuildResult{}, "BuildError": api.BuildError{},
		"Tenant": api.Tenant{}, "Quota": api.Quota{}, "Usage": api.Usage{}, "TenantList": api.TenantList{},
		"CreateTenantRequest": api.CreateTenantRequest{}, "APIKey": api.APIKey{}, "APIKeyList": api.KeyList{},
		"CreateKeyRequest": api.CreateKeyRequest{}, "Node": api.Node{}, "NodeLoad": api.NodeLoad{}, "BlankPool": api.BlankPool{},
		"NodeList": api.NodeList{}, "Admission": api.Admission{}, "Heartbeat": edge.Heartbeat{}, "HeartbeatReply": edge.HeartbeatReply{},
	}
	// Bodies the handlers write as maps, with no Go type to hold them to.
	untyped := []string{"Health"}
	for _, name := range sortedKeys(doc.Components.Schemas) {
		t.Run(name, func(t *testing.T) {
			v, ok := types[name]
			if !ok {
				if !slices.Contains(untyped, name) {
					t.Fatalf("schema %s has no Go type in this test: add it", name)
				}
				return
			}
			want := jsonFields(reflect.TypeOf(v))
			got := doc.properties(t, doc.Components.Schemas[name])
			for _, f := range sortedKeys(want) {
				if !got[f] {
					t.Errorf("%T has field %q, which the schema lacks", v, f)
				}
			}
			for _, f := range sortedKeys(got) {
				if !want[f] {
					t.Errorf("the schema has property %q, which %T lacks", f, v)
				}
			}
		})
	}
}

// properties are the property names of s, through $ref and allOf.
func (doc *openAPI) properties(t *testing.T, s *oaSchema) map[string]bool {
	props := map[string]bool{}
	if s.Ref != "" {
		name := strings.TrimPrefix(s.Ref, "#/components/schemas/")
		ref, ok := doc.Components.Schemas[name]
		if !ok {
			t.Fatalf("$ref %s names no schema", s.Ref)
		}
		return doc.properties(t, ref)
	}
	for p := range s.Properties {
		props[p] = true
	}
	for _, sub := range s.AllOf {
		for p := range doc.properties(t, sub) {
			props[p] = true
		}
	}
	return props
}

// jsonFields are the names encoding/json gives t's fields, embedded
// structs' fields included.
func jsonFields(t reflect.Type) map[string]bool {
	fields := map[string]bool{}
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		switch {
		case name == "-" || !f.IsExported():
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			for n := range jsonFields(f.Type) {
				fields[n] = true
			}
		case name == "":
			fields[f.Name] = true
		default:
			fields[name] = true
		}
	}
	return fields
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
