# The two commands the README gives a new user.
.PHONY: run test build

# Build and start blazed in the foreground with its default socket and data directory.
run:
	swift build -c release --product blazed
	swift build -c release --product blazectl
	.build/release/blazed

# Build everything (daemon, CLI, tests) and run the whole test suite.
test:
	swift build --build-tests
	swift test --skip-build --disable-xctest
