#ifndef BLAZE_SQLITE_CONFIG_H
#define BLAZE_SQLITE_CONFIG_H

/// Turns off SQLite's memory statistics, which take a process-wide mutex around every allocation SQLite makes
/// (Debian's build has no lookaside allocator, so that is every small allocation of every statement). Must run before
/// SQLite initializes (before the process opens its first database); returns SQLite's result code (SQLITE_MISUSE, 21,
/// when it was too late).
int blaze_sqlite_disable_memstatus(void);

#endif
