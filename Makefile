# The two commands the README gives a new user.
.PHONY: run test generate

# Build and start blazed in the foreground with its default socket and data directory.
run:
	swift build -c release --product blazed
	swift build -c release --product blazectl
	.build/release/blazed

# Build everything (daemon, CLI, tests) and run the whole test suite: Swift, then the Python and Node clients.
test:
	swift build --build-tests
	swift test --skip-build --disable-xctest
	bash Clients/test.sh

# Regenerate the clients and the daemon's copy of Protocol/blazedb.openrpc.json after editing it.
generate:
	python3 Protocol/codegen/generate.py
