// The outside check's insert client: an independent program, not sharing a line with blazebench, that times single
// durable inserts one at a time, each its own transaction, against blazed (raw JSON-RPC on its Unix socket) or
// PostgreSQL (libpq, PQexecParams: parsed per call, as a first program does), and prints p50/p90/p99 in µs.
//
//   insert_latency blazed SOCKET COUNT SHAPE TARGET      TARGET: a collection of database `default`
//   insert_latency pg CONNINFO COUNT SHAPE TARGET        TARGET: a table `(id text primary key, body jsonb)`
// SHAPE: `bench` (blazebench's 6-field document, ~250 B) or `small` (2 fields, ~40 B). The id is left to blazed.
// TARGET is a plain name (letters, digits, `_`): it goes into JSON and SQL as it is.
// Set PGINDEX=1 to give the PostgreSQL table blazebench's two expression indexes (email, age).
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void document(char *out, size_t cap, const char *shape, long i) {
  if (!strcmp(shape, "small")) {
    snprintf(out, cap, "{\"n\":%ld,\"name\":\"item %ld\"}", i, i);
  } else {
    snprintf(out, cap,
             "{\"age\":%ld,\"bio\":\"%070d\",\"email\":\"user%ld@example.com\",\"name\":\"user number %ld with a "
             "longer display name\",\"score\":%.2f,\"tags\":[\"alpha\",\"beta\",\"t%ld\"]}",
             i % 90, 0, i, i, i * 1.25, i % 17);
  }
}

static int blazed(const char *path, long count, const char *shape, const char *collection, double *latency) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un address = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof address.sun_path) {
    fprintf(stderr, "socket path too long: %s\n", path);
    return 1;
  }
  memcpy(address.sun_path, path, strlen(path) + 1);
  if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address)) {
    perror("connect");
    return 1;
  }
  char doc[1024], request[2048], reply[65536];
  for (long i = 0; i < count; i++) {
    document(doc, sizeof doc, shape, i);
    int length = snprintf(request, sizeof request,
                          "{\"jsonrpc\":\"2.0\",\"id\":%ld,\"method\":\"doc.insert\",\"params\":{\"db\":\"default\","
                          "\"collection\":\"%s\",\"doc\":%s}}\n",
                          i, collection, doc);
    if (length < 0 || length >= (int)sizeof request) {
      fprintf(stderr, "request too long\n");
      return 1;
    }
    double start = now_us();
    if (write(fd, request, length) != length) {
      perror("write");
      return 1;
    }
    size_t got = 0;
    do {
      if (got == sizeof reply - 1) {
        fprintf(stderr, "reply longer than %zu bytes\n", sizeof reply - 1);
        return 1;
      }
      ssize_t n = read(fd, reply + got, sizeof reply - 1 - got);
      if (n <= 0) {
        perror("read");
        return 1;
      }
      got += n;
    } while (reply[got - 1] != '\n');
    latency[i] = now_us() - start;
    reply[got] = 0;
    // One reply per request (no pipelining): it is the answer to this insert, a result or an error.
    if (strncmp(reply, "{", 1) || strstr(reply, "\"error\":") || !strstr(reply, "\"result\":")) {
      fprintf(stderr, "blazed refused an insert: %s", reply);
      return 1;
    }
  }
  close(fd);
  return 0;
}

static int postgres(const char *conninfo, long count, const char *shape, const char *table, double *latency) {
  PGconn *c = PQconnectdb(conninfo);
  if (PQstatus(c) != CONNECTION_OK) {
    fprintf(stderr, "%s", PQerrorMessage(c));
    return 1;
  }
  char sql[512], doc[1024], id[96];
  PQclear(PQexec(c, "SET client_min_messages = warning"));
  snprintf(sql, sizeof sql, "CREATE TABLE IF NOT EXISTS %s (id text PRIMARY KEY, body jsonb NOT NULL)", table);
  PQclear(PQexec(c, sql));
  if (getenv("PGINDEX")) {
    snprintf(sql, sizeof sql, "CREATE INDEX IF NOT EXISTS %s_email ON %s ((body->'email'))", table, table);
    PQclear(PQexec(c, sql));
    snprintf(sql, sizeof sql, "CREATE INDEX IF NOT EXISTS %s_age ON %s ((body->'age'))", table, table);
    PQclear(PQexec(c, sql));
  }
  PGresult *r = PQexec(c, "SELECT 'o-' || md5(random()::text)");  // ids unique across runs into one table
  if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
    fprintf(stderr, "%s", PQerrorMessage(c));
    return 1;
  }
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%s", PQgetvalue(r, 0, 0));
  PQclear(r);
  snprintf(sql, sizeof sql, "INSERT INTO %s (id, body) VALUES ($1, $2)", table);
  for (long i = 0; i < count; i++) {
    document(doc, sizeof doc, shape, i);
    snprintf(id, sizeof id, "%s-%ld", prefix, i);
    const char *values[2] = {id, doc};
    double start = now_us();
    r = PQexecParams(c, sql, 2, NULL, values, NULL, NULL, 0);
    latency[i] = now_us() - start;
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      fprintf(stderr, "%s", PQerrorMessage(c));
      return 1;
    }
    PQclear(r);
  }
  PQfinish(c);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 6 || (strcmp(argv[1], "blazed") && strcmp(argv[1], "pg")) || atol(argv[3]) < 1) {
    fprintf(stderr, "usage: insert_latency blazed|pg SOCKET|CONNINFO COUNT bench|small TARGET\n");
    return 2;
  }
  for (const char *t = argv[5]; *t; t++) {
    if (!(*t == '_' || (*t >= 'a' && *t <= 'z') || (*t >= 'A' && *t <= 'Z') || (*t >= '0' && *t <= '9'))) {
      fprintf(stderr, "TARGET must be letters, digits and _\n");
      return 2;
    }
  }
  long count = atol(argv[3]);
  double *latency = malloc(sizeof(double) * count);
  if (!latency) {
    perror("malloc");
    return 1;
  }
  int failed = !strcmp(argv[1], "blazed") ? blazed(argv[2], count, argv[4], argv[5], latency)
                                          : postgres(argv[2], count, argv[4], argv[5], latency);
  if (failed) return 1;
  qsort(latency, count, sizeof(double), by_value);
  printf("%.0f %.0f %.0f\n", latency[count / 2], latency[count * 9 / 10], latency[count * 99 / 100]);
  return 0;
}
