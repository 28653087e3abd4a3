/*
 * Daemons for the benchmarks: N gradsyncd on this machine, one per node,
 * joined through the rendezvous of node 0 on loopback, as scripts/demo.sh
 * and tests/integration/nodes.c start them; the trainers carry the job
 * (bench_job_env). The host backend is asked for explicitly: the bench
 * trainers hand over shared memory, not GPU buffers, whatever the machine
 * has.
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

/* Node 0's daemon's host: the job's coordinator. */
#define COORDINATOR "127.0.0.1"

void bench_job_env(const struct bench_cluster *cl, unsigned node, struct bench_job_env *out)
{
	snprintf(out->vars[0], sizeof(out->vars[0]), "GRADSYNC_LOCAL_SIZE=%u", cl->local);
	snprintf(out->vars[1], sizeof(out->vars[1]), "GRADSYNC_NODES=%u", cl->nodes);
	snprintf(out->vars[2], sizeof(out->vars[2]), "GRADSYNC_NODE_RANK=%u", node);
	snprintf(out->vars[3], sizeof(out->vars[3]), "GRADSYNC_COORDINATOR=" COORDINATOR);
	for (size_t i = 0; i < 4; i++)
		out->env[i] = out->vars[i];
	out->env[4] = NULL;
}

/* Where the other daemons reach node `node`'s: 127.0.0.<node + 1>, the
 * job's port. The daemons take no job: the trainers give it. Fills a[],
 * NULL-ends argv[]; returns how many. */
static size_t node_flags(const struct bench_cluster *cl, unsigned node, char a[][160],
			 const char **argv)
{
	snprintf(a[0], 160, "--node-address=127.0.0.%u", node + 1);
	snprintf(a[1], 160, "--node-port=%d", cl->port);
	argv[0] = a[0];
	argv[1] = a[1];
	argv[2] = NULL;
	return 2;
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
	/* The job: where every node's daemon listens, and its trainers'
	 * variables, come from all of it, before any daemon starts. */
	struct bench_cluster job = {.nodes = nodes, .local = local, .port = port};
	for (unsigned i = 0; i < nodes; i++) {
		char a[10][160];
		const char *argv[16] = {c->daemon, a[0], a[1], "--backend=host"};
		size_t n = 4;
		snprintf(cl->socket[i], sizeof(cl->socket[i]), "%s/node-%u.sock", dir, i);
		snprintf(cl->log[i], sizeof(cl->log[i]), "%s/gradsyncd-%u.log", dir, i);
		snprintf(a[0], sizeof(a[0]), "--socket=%s", cl->socket[i]);
		snprintf(a[1], sizeof(a[1]), "--join-timeout=60");
		n += node_flags(&job, i, a + 2, argv + n);
		cl->daemon[i] = bench_spawn(argv, cl->log[i], false);
		if (cl->daemon[i] < 0)
			goto fail;
		cl->nodes = i + 1;
		cl->local = local;
		cl->port = port;
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
