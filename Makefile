# dsec — build, test and run.
#
#   make run    install what is missing, build, start the all-in-one server
#   make test   install what is missing, build, run every test (as root)
#   make debian-base   with `make run` going: build the public base layer
#                      debian:12 (Debian bookworm + python3, pip, git) with
#                      debootstrap and upload it
#   make sandboxfusion-base   with `make run` going: build sandboxfusion:latest,
#                      the base SandboxFusion's /run_code runs in
#   make guest-kernel   fetch the microVM guest kernel (also done by run and test)

GO      ?= go
DATA    ?= .dsec
LISTEN  ?= 127.0.0.1:7070
# Debian packages dsec needs on a node, and the tests beside: PostgreSQL
# (the HA store's tests start private servers), util-linux (nsenter) and
# iproute2 (the multi-host test's network namespaces); g++ (copied into the
# toolchain base of the compatibility tests, internal/e2e/compat_test.go).
DEBS    := runc erofs-utils busybox-static fuse3 iproute2 util-linux postgresql python3 e2fsprogs nftables debootstrap git qemu-system-x86 g++ chromium
# Go tools the tests run (a real S3 server), built into bin/.
VERSITYGW := github.com/versity/versitygw/cmd/versitygw@v1.8.0
# The microVM guest kernel: Debian's cloud kernel, unpacked (never committed).
GUEST_KERNEL_PKG ?= linux-image-cloud-amd64
GUEST_KERNEL     := bin/guest-kernel
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all build run test deps tools check-go clean debian-base sandboxfusion-base guest-kernel

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

# guest-kernel downloads the kernel package the meta-package points at and
# unpacks its kernel and modules into bin/guest-kernel.
guest-kernel: $(GUEST_KERNEL)/.done

$(GUEST_KERNEL)/.done:
	@set -e; pkg=$$(apt-cache depends $(GUEST_KERNEL_PKG) 2>/dev/null | awk '/Depends: linux-image-/ {print $$2; exit}'); \
	if [ -z "$$pkg" ]; then apt-get update -qq; pkg=$$(apt-cache depends $(GUEST_KERNEL_PKG) | awk '/Depends: linux-image-/ {print $$2; exit}'); fi; \
	test -n "$$pkg" || { echo "cannot resolve $(GUEST_KERNEL_PKG)"; exit 1; }; \
	tmp=$$(mktemp -d); chmod 755 $$tmp; trap 'rm -rf $$tmp' EXIT; \
	echo "fetching guest kernel $$pkg"; \
	(cd $$tmp && apt-get download -q $$pkg 2>&1 | grep -v unsandboxed || true); \
	deb=$$(ls $$tmp/*.deb); rm -rf $(GUEST_KERNEL); mkdir -p $(GUEST_KERNEL); \
	dpkg-deb -x $$deb $$tmp/x; mv $$tmp/x/boot $$tmp/x/lib $(GUEST_KERNEL)/; \
	echo "$$pkg" > $@

run: deps build guest-kernel
	./bin/dsec server --data $(DATA) --listen $(LISTEN)

test: deps tools build guest-kernel
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...
	cd deploy && DSEC_BIN=$(CURDIR)/bin/dsec $(GO) test -count=1 ./...

# debian-base talks to the server `make run` started (same DATA and LISTEN).
DEBIAN_INCLUDE ?= python3,python3-pip,git
debian-base: deps build
	DSEC_URL=http://$(LISTEN) DSEC_API_KEY=$$(cat $(DATA)/admin.key) \
		./bin/dsec layer build --debootstrap bookworm --include $(DEBIAN_INCLUDE) --name debian:12 --public

# sandboxfusion-base: the public base layer /run_code runs in
# (sandboxfusion:latest: python3 + pytest, gcc/g++, Go, Node.js), with
# debootstrap; same DATA and LISTEN as `make run`.
sandboxfusion-base: deps build
	DSEC_URL=http://$(LISTEN) DSEC_API_KEY=$$(cat $(DATA)/admin.key) examples/build_sandboxfusion_base.sh

clean:
	rm -rf bin
