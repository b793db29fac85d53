package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

const inputUsage = `usage: dsec sandbox input ID ACTION...
  each ACTION is one of:
    move X Y | click X Y [left|right|middle] | double-click X Y | drag X0 Y0 X1 Y1
    scroll X Y DY [DX] | type TEXT | key CHORD (e.g. ctrl+alt+t, Return) | wait MS
    json '[{"type": "click", "x": 10, "y": 20}, ...]'`

// sandboxScreen is `dsec sandbox screenshot ID > s.png` and
// `dsec sandbox input ID ACTION...`.
func sandboxScreen(ctx context.Context, sub string, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if sub == "screenshot" {
		if len(pos) != 1 {
			return errors.New("usage: dsec sandbox screenshot ID > screen.png")
		}
		png, err := newClient().Screenshot(ctx, pos[0])
		if err != nil {
			return printErrorCode(err)
		}
		_, err = os.Stdout.Write(png)
		return err
	}
	if len(pos) < 2 {
		return errors.New(inputUsage)
	}
	actions, err := parseActions(pos[1:])
	if err != nil {
		return fmt.Errorf("%v\n%s", err, inputUsage)
	}
	res, err := newClient().Input(ctx, pos[0], actions...)
	if err != nil {
		return printErrorCode(err)
	}
	fmt.Fprintf(os.Stderr, "%d actions done on a %dx%d screen\n", res.Done, res.Display.Width, res.Display.Height)
	return nil
}

// parseActions reads the CLI's action words.
func parseActions(words []string) ([]api.InputAction, error) {
	var out []api.InputAction
	ints := func(n int) ([]int, error) {
		if len(words) < 1+n {
			return nil, fmt.Errorf("%s needs %d numbers", words[0], n)
		}
		v := make([]int, n)
		for i := range n {
			x, err := strconv.Atoi(words[1+i])
			if err != nil {
				return nil, fmt.Errorf("%s: %q is not a number", words[0], words[1+i])
			}
			v[i] = x
		}
		return v, nil
	}
	for len(words) > 0 {
		var (
			a    api.InputAction
			used int
			err  error
			v    []int
		)
		switch words[0] {
		case "move":
			if v, err = ints(2); err == nil {
				a, used = client.Move(v[0], v[1]), 3
			}
		case "click", "double-click":
			if v, err = ints(2); err == nil {
				count, used := 1, 3
				if words[0] == "double-click" {
					count = 2
				}
				button := ""
				if len(words) > 3 && (words[3] == "left" || words[3] == "right" || words[3] == "middle") {
					button, used = words[3], 4
				}
				out = append(out, client.Click(v[0], v[1], button, count))
				words = words[used:]
				continue
			}
		case "drag":
			if v, err = ints(4); err == nil {
				a, used = client.Drag(v[0], v[1], v[2], v[3]), 5
			}
		case "scroll":
			if v, err = ints(3); err == nil {
				a, used = client.Scroll(v[0], v[1], 0, v[2]), 4
				if len(words) > 4 {
					if dx, e := strconv.Atoi(words[4]); e == nil {
						a.DX, used = dx, 5
					}
				}
			}
		case "type", "key", "json":
			if len(words) < 2 {
				return nil, fmt.Errorf("%s needs an argument", words[0])
			}
			switch words[0] {
			case "type":
				a = client.Type(words[1])
			case "key":
				a = client.Key(words[1])
			default:
				var list []api.InputAction
				dec := json.NewDecoder(strings.NewReader(words[1]))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&list); err != nil {
					return nil, fmt.Errorf("json: %v", err)
				}
				out = append(out, list...)
				words = words[2:]
				continue
			}
			used = 2
		case "wait":
			if v, err = ints(1); err == nil {
				a, used = client.Wait(v[0]), 2
			}
		default:
			return nil, fmt.Errorf("unknown action %q", words[0])
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a)
		words = words[used:]
	}
	return out, nil
}
