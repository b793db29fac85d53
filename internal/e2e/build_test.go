package e2e

import (
	"archive/tar"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// buildCtx is a build context with a Dockerfile.
func buildCtx(t *testing.T, dockerfile string, files ...tarFile) *strings.Reader {
	t.Helper()
	all := append([]tarFile{{name: "Dockerfile", body: dockerfile}}, files...)
	return strings.NewReader(makeTar(t, all...).String())
}

func build(t *testing.T, c *client.Client, name, dockerfile string, files ...tarFile) (*api.BuildResult, []api.BuildEvent, error) {
	t.Helper()
	var evs []api.BuildEvent
	res, err := c.BuildLayer(ctxT(t), client.BuildOptions{Name: name}, buildCtx(t, dockerfile, files...),
		func(ev api.BuildEvent) { evs = append(evs, ev) })
	return res, evs, err
}

// TestDockerfileBuild builds a 6-step Dockerfile into a layer sandboxes
// start from (with its env and workdir), rebuilds it after a change to the
// last line running only that line, copies between stages, and reports a
// failing RUN at its line with its output; bad Dockerfiles are 4xx and no
// build leaves a sandbox behind.
func TestDockerfileBuild(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	const six = `FROM base:minimal
ARG WHO=world
ENV GREETING="hello $WHO"
WORKDIR /app
COPY --chown=1000:1000 src/ ./
RUN echo "$GREETING" > greeting && cat /app/msg
`
	files := []tarFile{{name: "src/", typ: tar.TypeDir}, {name: "src/msg", body: "from the context\n"}}
	res, evs, err := build(t, c, "built:1", six, files...)
	if err != nil {
		t.Fatalf("build: %v (events %+v)", err, evs)
	}
	if res.Steps != 5 || res.CachedSteps != 0 || res.Layer.Kind != api.KindSnapshot {
		t.Fatalf("result %+v", res)
	}
	var sawOutput bool
	for _, ev := range evs {
		if ev.Output != nil && ev.Output.Line == 6 && strings.Contains(ev.Output.Data, "from the context") {
			sawOutput = true
		}
	}
	if !sawOutput {
		t.Fatalf("no RUN output streamed: %+v", evs)
	}
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{Snapshot: "built:1", Resources: api.Resources{MemoryMB: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	if got := sh(t, c, sb.ID, `pwd; echo "$GREETING"; cat greeting; stat -c %u:%g msg`); got != "/app\nhello world\nhello world\n1000:1000\n" {
		t.Fatalf("sandbox from the build sees %q", got)
	}

	// A change to the last line runs only that line.
	res2, _, err := build(t, c, "built:2", six+"RUN echo again > /app/again\n", files...)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Steps != 6 || res2.CachedSteps != 2 {
		t.Fatalf("rebuild: %d steps, %d cached; want 6 and the COPY and first RUN cached", res2.Steps, res2.CachedSteps)
	}

	// Multi-stage: COPY --from another stage, flattened into a base.
	var evs3 []api.BuildEvent
	res3, err := c.BuildLayer(ctx, client.BuildOptions{Name: "multi:1", Flatten: true}, buildCtx(t, `FROM built:2 AS first
RUN echo made-in-first > /app/made
FROM base:minimal
COPY --from=first /app /copied
`), func(ev api.BuildEvent) { evs3 = append(evs3, ev) })
	if err != nil {
		t.Fatalf("multi-stage: %v %+v", err, evs3)
	}
	if res3.Layer.Kind != api.KindBase {
		t.Fatalf("flattened build %+v", res3.Layer)
	}
	sb3 := newSandbox(t, c, &api.LayerRefs{Base: "multi:1"})
	if got := sh(t, c, sb3.ID, "cat /copied/made /copied/again /copied/msg"); got != "made-in-first\nagain\nfrom the context\n" {
		t.Fatalf("COPY --from: %q", got)
	}

	// A failing RUN: its line, exit code and output.
	_, _, err = build(t, c, "fails:1", "FROM base:minimal\nENV X=1\nRUN echo about to fail; exit 7\n")
	var be *client.BuildError
	if !errors.As(err, &be) || be.Line != 3 || be.ExitCode == nil || *be.ExitCode != 7 || !strings.Contains(be.Output, "about to fail") {
		t.Fatalf("failing RUN = %#v", err)
	}

	t.Run("bad Dockerfiles", func(t *testing.T) {
		tests := []struct {
			name, dockerfile, code, want string
		}{
			{"unknown instruction", "FROM base:minimal\nFROBNICATE x\n", api.CodeInvalid, "line 2"},
			{"COPY outside the context", "FROM base:minimal\nCOPY ../../etc/passwd /x\n", api.CodeInvalid, "outside the build context"},
			{"unknown base", "FROM nope:1\n", api.CodeInvalid, "line 1"},
			{"COPY --from no stage", "FROM base:minimal\nCOPY --from=ghost /a /b\n", api.CodeInvalid, "ghost"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				_, _, err := build(t, c, "bad:1", tc.dockerfile)
				if client.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("build = %v, want %s with %q", err, tc.code, tc.want)
				}
			})
		}
		if _, err := c.BuildLayer(ctx, client.BuildOptions{Name: "bad:1"}, strings.NewReader("not a tar at all, not at all"), nil); client.Code(err) != api.CodeInvalid {
			t.Fatalf("build of a non-tar = %v", err)
		}
	})

	all, err := c.ListSandboxes(ctx, client.ListOptions{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all.Sandboxes {
		if sb.Labels["dsec.build"] != "" {
			t.Fatalf("a build left its sandbox %s", sb.ID)
		}
	}
	c.DeleteSandbox(ctx, sb.ID)
	c.DeleteSandbox(ctx, sb3.ID)
	deleteAll(t, c)
	testutil.RequireNoSandboxLeft(t, s)
}
