#include "support/process_limits.h"

#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>

#include "support/log.h"
#include "support/settings.h"

/* Descriptors gradsyncd keeps for itself beyond clients and parked ones:
 * sockets, the loop, timers, the worker's eventfds, log and trace files,
 * the one held in reserve to refuse connections when the rest are spent,
 * and per job its worker's, its rendezvous and its Gloo connections (a
 * job of many nodes opens more as it joins: a shortage then fails that
 * job's join, naming it, not the daemon). */
static uint64_t own_fds(const struct gs_settings *s)
{
	return 128 + 32 * s->max_jobs;
}

/* Mappings the daemon makes itself: libraries, stacks, fusion buffers. */
#define OWN_MAPPINGS 1024

static void check_mappings(const struct gs_settings *s)
{
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	unsigned long long max = 0;
	if (!f)
		return;
	if (fscanf(f, "%llu", &max) == 1 && s->max_mappings + OWN_MAPPINGS > max)
		gs_warn("--max-mappings %llu plus gradsyncd's own mappings passes vm.max_map_count %llu: trainers' registrations may fail with ENOMEM before the limit refuses them",
			(unsigned long long)s->max_mappings, max);
	fclose(f);
}

int gs_limits_check(const struct gs_settings *s)
{
	check_mappings(s);
	uint64_t need = s->max_clients + s->max_parked_fds + own_fds(s);
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	/* RLIM_INFINITY is the largest rlim_t: it passes these as it should. */
	if (rl.rlim_cur >= need)
		return 0;
	if (rl.rlim_max >= need) {
		struct rlimit raised = { (rlim_t)need, rl.rlim_max };
		if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
			gs_info("raised the soft RLIMIT_NOFILE from %llu to %llu for --max-clients and --max-parked-fds",
				(unsigned long long)rl.rlim_cur, (unsigned long long)need);
			return 0;
		}
	}
	fprintf(stderr, "gradsyncd: --max-clients %llu + --max-parked-fds %llu + %llu descriptors of its own need %llu descriptors, but RLIMIT_NOFILE allows %llu (hard %llu): lower those settings or raise the limit (LimitNOFILE= in the unit, ulimit -n)\n",
		(unsigned long long)s->max_clients, (unsigned long long)s->max_parked_fds,
		(unsigned long long)own_fds(s), (unsigned long long)need,
		(unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
	return -1;
}
