// Command wsecho is a WebSocket echo server that tests run inside a
// sandbox: it answers every message on ws://:PORT/echo with the same
// message.
package main

import (
	"context"
	"net/http"
	"os"

	"github.com/coder/websocket"
)

func main() {
	http.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			if err := c.Write(context.Background(), typ, b); err != nil {
				return
			}
		}
	})
	if err := http.ListenAndServe("127.0.0.1:"+os.Args[1], nil); err != nil {
		os.Exit(1)
	}
}
