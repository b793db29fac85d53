package main

import (
	"context"
	"errors"
)

func benchCmd(ctx context.Context, args []string) error {
	return errors.New("dsec bench: not built yet")
}
