# dsec — build, test and run.
#
#   make run    install what is missing, build, start the all-in-one server
#   make test   install what is missing, build, run every test (as root)
#   make test-unit   the tests that need neither root nor a tool beyond Go
#                    (any user, no install; under -race: UNIT_FLAGS= to drop it)
#   make lint   gofmt, go vet and staticcheck
#   make debian-base   with `make run` going: build the public base layer
#                      debian:12 (Debian bookworm + python3, pip, git) with
#                      debootstrap and upload it
#   make sandboxfusion-base   with `make run` going: build sandboxfusion:latest,
#                      the base SandboxFusion's /run_code runs in
#   make guest-kernel   fetch the microVM guest kernel (also done by run and test)
#   make vm-image       build the small bootable vm image the fullvm tests boot (also done by test)
#   make desktop-image  build and upload desktop:debian-12, a fullvm desktop (network; ~1 h; not in test)
#   make e2b-proto      regenerate the E2B envd Connect code (committed) from its .proto files

GO      ?= go
DATA    ?= .dsec
LISTEN  ?= 127.0.0.1:7070
# Debian packages dsec needs on a node, and the tests beside: PostgreSQL
# (the HA store's tests start private servers), util-linux (nsenter),
# iproute2 (the multi-host test's network namespaces), g++ (copied into the
# toolchain base of the compatibility tests, internal/e2e/compat_test.go)
# gcc (go test -race needs cgo), tmux and chromium (the terminal and
# port tests drive a real terminal and a real browser), qemu-utils (qemu-img: full VMs' copy-on-write disks).
DEBS    := runc erofs-utils busybox-static fuse3 iproute2 util-linux postgresql python3 e2fsprogs nftables debootstrap git qemu-system-x86 g++ gcc libc6-dev tmux chromium qemu-utils xvfb xterm x11vnc
# Go tools the tests run (a real S3 server), built into bin/.
VERSITYGW := github.com/versity/versitygw/cmd/versitygw@v1.8.0
# The linter, built into bin/ by make lint.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The microVM guest kernel: Debian's cloud kernel, unpacked (never committed).
GUEST_KERNEL_PKG ?= linux-image-cloud-amd64
GUEST_KERNEL     := bin/guest-kernel
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all build run test test-unit lint deps tools check-go clean debian-base sandboxfusion-base guest-kernel vm-image e2b-proto desktop-image

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
	@# npm for the E2B SDK test, unless a Node.js with its own npm is there.
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }

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

# vm-image builds the small vm layer the fullvm backend's tests boot:
# debootstrap minbase bookworm with the cloud kernel, systemd and the
# dsec-agent of this tree as a unit, as a qcow2 disk (bin/, never
# committed). It is kept until `make clean`: after changing the agent,
# remove it to rebuild.
VM_IMAGE := bin/vm-debian-12.qcow2
vm-image: $(VM_IMAGE)

$(VM_IMAGE): | build
	./bin/dsec layer build --vm --debootstrap bookworm --output $@

# desktop-image builds the desktop vm layer desktop:debian-12 (Xorg,
# Openbox, xterm, root logged in on the screen) and uploads it to the
# running server ($$DSEC_URL, $$DSEC_API_KEY or ./.dsec/admin.key); see
# examples/build_desktop_image.sh. It needs the network and takes most of
# an hour: never part of test or CI.
desktop-image: build
	examples/build_desktop_image.sh

run: deps build guest-kernel
	./bin/dsec server --data $(DATA) --listen $(LISTEN)

test: deps tools build guest-kernel vm-image
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 25m ./...
	cd deploy && DSEC_BIN=$(CURDIR)/bin/dsec $(GO) test -count=1 ./...

# test-unit runs every test that needs neither root, a tool beyond Go nor
# the kernel's features: testutil.Require skips a test that states any
# requirement (DSEC_TEST_UNIT=1), also under CI, and -short skips the long
# ones. No install, any user. They run under the race detector (it needs
# gcc, which CI installs); UNIT_FLAGS= runs them without it.
UNIT_FLAGS ?= -race
test-unit: check-go
	DSEC_TEST_UNIT=1 $(GO) test $(UNIT_FLAGS) -short -count=1 -timeout 10m ./...

# lint fails on unformatted code, go vet's findings and staticcheck's.
lint: check-go
	@test -x bin/staticcheck || GOBIN=$(CURDIR)/bin $(GO) install $(STATICCHECK)
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	bin/staticcheck ./...

# ui-vendor rebuilds the dashboard's third-party files (xterm.js and its
# fit addon) from npm at the versions web/ui-vendor/package-lock.json pins
# and copies them into internal/ui/assets/vendor, which is committed (the
# binary embeds it), so neither the build nor the tests need npm.
UI_VENDOR := internal/ui/assets/vendor
.PHONY: ui-vendor
ui-vendor:
	cd web/ui-vendor && npm ci --no-audit --no-fund
	rm -rf $(UI_VENDOR) && mkdir -p $(UI_VENDOR)
	cp web/ui-vendor/node_modules/@xterm/xterm/lib/xterm.js web/ui-vendor/node_modules/@xterm/xterm/css/xterm.css $(UI_VENDOR)/
	cp web/ui-vendor/node_modules/@xterm/xterm/LICENSE $(UI_VENDOR)/LICENSE.xterm
	cp web/ui-vendor/node_modules/@xterm/addon-fit/lib/addon-fit.js $(UI_VENDOR)/
	cp web/ui-vendor/node_modules/@xterm/addon-fit/LICENSE $(UI_VENDOR)/LICENSE.addon-fit
	sed -i '/^\/\/# sourceMappingURL=/d' $(UI_VENDOR)/*.js

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

# e2b-proto regenerates internal/compat/e2b/envdpb (committed; never run
# by build or test). Needs protoc (apt: protobuf-compiler); the two Go
# plugins are built into bin/ at the versions go.mod pins.
E2B_PROTO := internal/compat/e2b/envdpb
e2b-proto: check-go
	@command -v protoc >/dev/null || { echo "needs protoc (apt-get install protobuf-compiler)"; exit 1; }
	GOBIN=$(CURDIR)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	PATH=$(CURDIR)/bin:$$PATH protoc -I $(E2B_PROTO) --go_out=$(E2B_PROTO) --go_opt=paths=source_relative \
		--connect-go_out=$(E2B_PROTO) --connect-go_opt=paths=source_relative \
		process/process.proto filesystem/filesystem.proto

clean:
	rm -rf bin
