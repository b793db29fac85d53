# dsec — build, test and run.
#
#   make run    install what is missing, build, start the all-in-one server
#   make test   install what is missing, build, run every test (as root)
#   make debian-base   with `make run` going: build the public base layer
#                      debian:12 (Debian bookworm + python3, pip, git) with
#                      debootstrap and upload it

GO      ?= go
DATA    ?= .dsec
LISTEN  ?= 127.0.0.1:7070
# Debian packages dsec needs on a node.
DEBS    := runc erofs-utils busybox-static fuse3 iproute2 python3 e2fsprogs nftables debootstrap git
# Go tools the tests run (a real S3 server), built into bin/.
VERSITYGW := github.com/versity/versitygw/cmd/versitygw@v1.8.0
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all build run test deps tools check-go clean debian-base

all: build

check-go:
	@command -v $(GO) >/dev/null || { echo "Go 1.26 or newer is needed (https://go.dev/dl/): not found on PATH"; exit 1; }

# deps installs the Debian packages that are missing, and only those.
deps:
	@missing=""; for p in $(DEBS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# tools builds the Go tools tests need, once.
tools: check-go
	@test -x bin/versitygw || GOBIN=$(CURDIR)/bin $(GO) install $(VERSITYGW)

build: check-go
	CGO_ENABLED=0 $(GO) build -o bin/dsec-agent ./cmd/dsec-agent
	CGO_ENABLED=0 $(GO) build -o bin/dsec ./cmd/dsec

run: deps build
	./bin/dsec server --data $(DATA) --listen $(LISTEN)

test: deps tools build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...

# debian-base talks to the server `make run` started (same DATA and LISTEN).
DEBIAN_INCLUDE ?= python3,python3-pip,git
debian-base: deps build
	DSEC_URL=http://$(LISTEN) DSEC_API_KEY=$$(cat $(DATA)/admin.key) \
		./bin/dsec layer build --debootstrap bookworm --include $(DEBIAN_INCLUDE) --name debian:12 --public

clean:
	rm -rf bin
