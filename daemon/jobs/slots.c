/*
 * Places on the node: the limits on jobs and trainers, the node's
 * (--max-jobs, --max-trainers) and each user's (--max-jobs-per-user,
 * --max-trainers-per-user), and which lingering job gives way to a new
 * job that finds no place free. The policy only: the table (jobs.c) asks
 * before it attaches a trainer or opens a job, and does what it is told.
 *
 * A user is a uid, root included: the limits are there so that one user's
 * jobs, through a mistake as much as through malice, cannot take every
 * place of a node that others share, and root's runaway launcher takes
 * them as well as anyone's. A node whose jobs all run as one user (root
 * in containers) sets the per-user limits to 0, which means none.
 */
#include <stdio.h>
#include <uv.h>

#include "engine/trainer.h"
#include "jobs/jobs.h"

static unsigned trainers_of(const struct gs_jobs *t, uid_t uid)
{
	unsigned n = 0;
	for (const struct gs_job_entry *e = t->head; e; e = e->next)
		for (unsigned r = 0; r < GS_MAX_LOCAL; r++)
			n += e->job.slots[r] && e->job.slots[r]->uid == uid;
	return n;
}

/* A job belongs to the user whose trainer began it, for its whole life
 * (engine/ownership.h). */
static bool owned_by(const struct gs_job_entry *e, uid_t uid)
{
	return e->settings.owner == uid;
}

static unsigned jobs_of(const struct gs_jobs *t, uid_t uid)
{
	unsigned n = 0;
	for (const struct gs_job_entry *e = t->head; e; e = e->next)
		n += owned_by(e, uid);
	return n;
}

/* A job with no trainer whose end is already set (it lingers, or goes in
 * this turn of the loop, having nothing to keep). */
static bool going(const struct gs_job_entry *e)
{
	if (e->state == GS_ENTRY_LINGERING)
		return true;
	return !gs_job_active(&e->job) && uv_is_active((const uv_handle_t *)&e->linger_timer);
}

/* The job of those going (of uid's, or anyone's when !mine) whose end is
 * nearest: the one that has lingered longest. NULL: none. */
static struct gs_job_entry *first_to_go(const struct gs_jobs *t, bool mine, uid_t uid)
{
	struct gs_job_entry *best = NULL;
	uint64_t best_due = 0;
	for (struct gs_job_entry *e = t->head; e; e = e->next) {
		if (!going(e) || (mine && !owned_by(e, uid)))
			continue;
		uint64_t due = uv_timer_get_due_in(&e->linger_timer);
		if (!best || due < best_due) {
			best = e;
			best_due = due;
		}
	}
	return best;
}

bool gs_jobs_trainer_fits(const struct gs_jobs *t, uid_t uid, char *why, size_t n)
{
	const struct gs_settings *s = t->env.settings;
	unsigned all = gs_jobs_trainers(t);
	if (all >= s->max_trainers) {
		snprintf(why, n, "this node serves %u trainers already, its most (--max-trainers)", all);
		return false;
	}
	unsigned mine = s->max_trainers_per_user ? trainers_of(t, uid) : 0;
	if (s->max_trainers_per_user && mine >= s->max_trainers_per_user) {
		snprintf(why, n, "uid %u has %u trainers on this node already, its most (--max-trainers-per-user)",
			 (unsigned)uid, mine);
		return false;
	}
	return true;
}

bool gs_jobs_job_fits(const struct gs_jobs *t, uid_t uid, struct gs_job_entry **yield,
		      char *why, size_t n)
{
	const struct gs_settings *s = t->env.settings;
	*yield = NULL;
	unsigned mine = s->max_jobs_per_user ? jobs_of(t, uid) : 0;
	if (s->max_jobs_per_user && mine >= s->max_jobs_per_user) {
		/* The user's own lingering job gives way: that frees the
		 * node's place too. */
		*yield = first_to_go(t, true, uid);
		snprintf(why, n, "uid %u has %u jobs on this node already, its most (--max-jobs-per-user)",
			 (unsigned)uid, mine);
		return *yield != NULL;
	}
	if (t->count >= s->max_jobs) {
		*yield = first_to_go(t, false, uid);
		snprintf(why, n, "this node serves %u jobs already, its most (--max-jobs)", t->count);
		return *yield != NULL;
	}
	return true;
}
