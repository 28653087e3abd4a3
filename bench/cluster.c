/*
 * Daemons for the benchmarks: N gradsyncd on this machine, one per node,
 * joined through the rendezvous of node 0 on loopback, as scripts/demo.sh
 * and tests/integration/test-nodes.c start them. The host backend is asked
 * for explicitly: the bench trainers hand over shared memory, not GPU
 * buffers, whatever the machine has.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "suite.h"

#define READY_TIMEOUT_MS 60000

static bool can_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

void bench_dump(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	if (!f)
		return;
	fprintf(stderr, "---- %s\n", path);
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fclose(f);
}

void bench_cluster_stop(struct bench_cluster *cl)
{
	for (unsigned i = 0; i < cl->nodes; i++)
		bench_stop(cl->daemon[i], 10000);
	cl->nodes = 0;
}

int bench_cluster_start(struct bench_cluster *cl, const struct bench_config *c, const char *dir,
			unsigned nodes, unsigned local)
{
	int port = bench_free_port();
	memset(cl, 0, sizeof(*cl));
	if (port < 0 || nodes > BENCH_MAX_NODES) {
		fprintf(stderr, "gradsync-bench: no free port or too many nodes\n");
		return -1;
	}
	for (unsigned i = 0; i < nodes; i++) {
		char a[6][160];
		snprintf(cl->socket[i], sizeof(cl->socket[i]), "%s/node-%u.sock", dir, i);
		snprintf(cl->log[i], sizeof(cl->log[i]), "%s/gradsyncd-%u.log", dir, i);
		snprintf(a[0], sizeof(a[0]), "--socket=%s", cl->socket[i]);
		snprintf(a[1], sizeof(a[1]), "--local-size=%u", local);
		snprintf(a[2], sizeof(a[2]), "--nodes=%u", nodes);
		snprintf(a[3], sizeof(a[3]), "--node-rank=%u", i);
		snprintf(a[4], sizeof(a[4]), "--coordinator=127.0.0.1:%d", port);
		snprintf(a[5], sizeof(a[5]), "--join-timeout=60");
		const char *argv[] = {
		    c->daemon,	      a[0], a[1], a[2], a[3], a[4], a[5], "--gloo-host=127.0.0.1",
		    "--backend=host", NULL};
		cl->daemon[i] = bench_spawn(argv, cl->log[i], false);
		if (cl->daemon[i] < 0)
			goto fail;
		cl->nodes = i + 1;
	}
	double deadline = gs_now_ms() + READY_TIMEOUT_MS;
	for (unsigned i = 0; i < nodes; i++) {
		while (!can_connect(cl->socket[i])) {
			if (!bench_alive(cl->daemon[i]) || gs_now_ms() > deadline) {
				fprintf(stderr, "gradsync-bench: gradsyncd %u did not start\n", i);
				bench_dump(cl->log[i]);
				goto fail;
			}
			nanosleep(&(struct timespec){0, 10000000}, NULL);
		}
	}
	return 0;
fail:
	bench_cluster_stop(cl);
	return -1;
}
