// sqlite3_config is variadic, which Swift cannot call.
#include <sqlite3.h>

#include "blaze_sqlite_config.h"

int blaze_sqlite_disable_memstatus(void) { return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }
