#include "jobs/jobs.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "clock.h"
#include "engine/job_view.h"
#include "engine/ownership.h"
#include "engine/trainer.h"
#include "errors.h"
#include "job_id.h"
#include "support/log.h"

struct gs_job_entry *gs_jobs_entry_of(const struct gs_job *j)
{
	return (struct gs_job_entry *)((char *)j - offsetof(struct gs_job_entry, job));
}

static struct gs_job_entry *find(const struct gs_jobs *t, const char *id)
{
	for (struct gs_job_entry *e = t->head; e; e = e->next)
		if (strcmp(e->settings.job_id, id) == 0)
			return e;
	return NULL;
}

unsigned gs_jobs_trainers(const struct gs_jobs *t)
{
	unsigned n = 0;
	for (const struct gs_job_entry *e = t->head; e; e = e->next)
		n += e->job.attached;
	return n;
}

/* Adds one job's figures to the node's: its recent step times join the
 * node's window of them (in the order they came, the job's last), and the
 * last step is whichever job's ended last. */
static void add_stats(struct gs_stats *to, const struct gs_stats *s)
{
	to->steps_aborted += s->steps_aborted;
	to->bytes_reduced += s->bytes_reduced;
	to->elements_clipped += s->elements_clipped;
	to->nonfinite += s->nonfinite;
	to->step_ns_sum += s->step_ns_sum;
	for (size_t i = 0; i < GS_STEP_BUCKETS; i++)
		to->step_le[i] += s->step_le[i];
	uint64_t kept = s->steps_completed < GS_STEP_HISTORY ? s->steps_completed : GS_STEP_HISTORY;
	/* Steps older than the job's window count, but have no time to add
	 * (and then the window's entries fill the node's whole window). */
	to->steps_completed += s->steps_completed - kept;
	for (uint64_t i = s->steps_completed - kept; i < s->steps_completed; i++)
		to->history[to->steps_completed++ % GS_STEP_HISTORY] = s->history[i % GS_STEP_HISTORY];
	if (s->last_step_end_ns > to->last_step_end_ns) {
		to->last_step_end_ns = s->last_step_end_ns;
		to->last_step_ns = s->last_step_ns;
	}
}

void gs_jobs_totals(const struct gs_jobs *t, struct gs_stats *out)
{
	*out = t->ended;
	for (const struct gs_job_entry *e = t->head; e; e = e->next)
		add_stats(out, &e->job.stats);
}

const char *const gs_entry_state_names[GS_ENTRY_STATES] = {
	[GS_ENTRY_JOINING] = "joining",
	[GS_ENTRY_READY] = "ready",
	[GS_ENTRY_LINGERING] = "lingering",
	[GS_ENTRY_CLOSING] = "closing",
};

const char *gs_entry_state_name(const struct gs_job_entry *e)
{
	if (e->state == GS_ENTRY_READY)
		return gs_job_state(&e->job);
	return gs_entry_state_names[e->state];
}

/* ---- Closing a job ----------------------------------------------------- */

static void free_entry(struct gs_job_entry *e)
{
	gs_job_destroy(&e->job);
	gs_cluster_destroy(&e->cluster);
	if (e->backend)
		e->backend->ops->destroy(e->backend);
	free(e);
}

/* The entry's memory holds handles that entry_close closed; their close
 * is finished only once the closing pass that ran the free timer's close
 * callback is over. A timer of its own frees the entry in the next turn
 * of the loop. */
struct deferred_free {
	uv_timer_t timer;
	struct gs_job_entry *entry;
};

static void free_deferred(uv_handle_t *h)
{
	free(h->data);
}

static void on_deferred_free(uv_timer_t *timer)
{
	struct deferred_free *df = timer->data;
	free_entry(df->entry);
	uv_close((uv_handle_t *)timer, free_deferred);
}

static void free_timer_closed(uv_handle_t *h)
{
	struct gs_job_entry *e = h->data;
	struct deferred_free *df = malloc(sizeof(*df));
	if (!df) {
		gs_warn("job '%s': out of memory freeing it: its memory is kept", e->settings.job_id);
		return;
	}
	df->entry = e;
	uv_timer_init(h->loop, &df->timer);
	df->timer.data = df;
	uv_timer_start(&df->timer, on_deferred_free, 0, 0);
}

static void on_free_timer(uv_timer_t *timer)
{
	struct gs_job_entry *e = timer->data;
	if (e->worker_started) {
		e->worker_started = false;
		gs_worker_stop(&e->worker);
	}
	uv_close((uv_handle_t *)timer, free_timer_closed);
}

static bool unlink_from(struct gs_job_entry **list, struct gs_job_entry *e)
{
	for (struct gs_job_entry **p = list; *p; p = &(*p)->next) {
		if (*p == e) {
			*p = e->next;
			e->next = NULL;
			return true;
		}
	}
	return false;
}

static void unlink_entry(struct gs_jobs *t, struct gs_job_entry *e)
{
	if (unlink_from(&t->head, e))
		t->count--;
	else
		unlink_from(&t->refused, e);
}

/* The group's parts: the rendezvous the job's node 0 serves under its id
 * goes now, so that a new job of that id can take its place. Any wait on
 * the other nodes ends first (the cluster then ignores what completes). */
static void cancel_cluster(struct gs_job_entry *e)
{
	if (e->cluster_started)
		gs_cluster_cancel(&e->cluster);
}

static void close_cluster(struct gs_job_entry *e)
{
	if (!e->cluster_started)
		return;
	e->cluster_started = false;
	gs_cluster_close(&e->cluster);
}

static void entry_close(struct gs_job_entry *e)
{
	if (e->state == GS_ENTRY_CLOSING)
		return;
	struct gs_jobs *t = e->table;
	e->state = GS_ENTRY_CLOSING;
	unlink_entry(t, e);
	add_stats(&t->ended, &e->job.stats);
	if (e->settings.wire >= 0 && e->settings.wire < 4)
		t->ended_wire_bytes[e->settings.wire] += e->job.stats.bytes_reduced;
	cancel_cluster(e);
	close_cluster(e);
	gs_job_close(&e->job);
	uv_close((uv_handle_t *)&e->linger_timer, NULL);
	/* The worker is stopped from the loop's next turn: a collective it is
	 * in ends when the other nodes see this one go, which they do once
	 * the loop has closed its connections. */
	uv_timer_start(&e->free_timer, on_free_timer, 0, 0);
}

/* The job has no trainer and no work left: its group waits --job-linger
 * for them to come back (the timer, not this call, closes it: the engine
 * is still in the call that found it idle). */
static void on_linger(uv_timer_t *timer)
{
	struct gs_job_entry *e = timer->data;
	if (gs_job_active(&e->job))
		return;
	if (e->state == GS_ENTRY_LINGERING)
		gs_info("job '%s': no trainer came back within %llu s (--job-linger): its group goes",
			e->settings.job_id, (unsigned long long)e->table->env.settings->job_linger);
	entry_close(e);
}

static void on_idle(void *arg)
{
	struct gs_job_entry *e = arg;
	if (e->state == GS_ENTRY_CLOSING)
		return;
	uint64_t linger = e->table->env.settings->job_linger;
	/* A job whose group failed, or that never had one, keeps nothing; a
	 * job of one node has no group of nodes to keep; and a daemon that
	 * stops keeps nothing. */
	if (!e->cluster_started || e->settings.nodes <= 1 || e->table->stopping)
		linger = 0;
	/* Already lingering: its time runs on, unless there is nothing left
	 * to keep (its trainers left while it joined, and then the join
	 * failed: it must not outlive the failure by --job-linger). */
	if (uv_is_active((uv_handle_t *)&e->linger_timer) && linger > 0)
		return;
	if (e->state == GS_ENTRY_READY && linger > 0) {
		e->state = GS_ENTRY_LINGERING;
		gs_info("job '%s': every trainer has left; keeping its group for %llu s (--job-linger)",
			e->settings.job_id, (unsigned long long)linger);
	}
	uv_timer_start(&e->linger_timer, on_linger, linger * 1000, 0);
}

/* ---- Opening a job ------------------------------------------------------ */

static void welcome_waiting(struct gs_job_entry *e)
{
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++) {
		struct gs_trainer *tr = e->job.slots[r];
		if (tr && !e->welcomed[r]) {
			e->welcomed[r] = true;
			e->table->env.welcome(tr, e);
		}
	}
}

static void on_ready(void *arg, int rc, const char *why)
{
	struct gs_job_entry *e = arg;
	if (e->state == GS_ENTRY_CLOSING)
		return;
	if (rc == GS_OK) {
		e->groups_built++;
		e->table->groups_built++;
		if (e->state == GS_ENTRY_JOINING)
			e->state = GS_ENTRY_READY;
		welcome_waiting(e);
		return;
	}
	/* The trainers waiting are told why; the job goes once they have. */
	struct gs_trainer *waiting[GS_MAX_LOCAL];
	unsigned n = 0;
	for (unsigned r = 0; r < GS_MAX_LOCAL; r++)
		if (e->job.slots[r])
			waiting[n++] = e->job.slots[r];
	unlink_entry(e->table, e);
	e->next = e->table->refused;
	e->table->refused = e;
	e->state = GS_ENTRY_READY; /* found by nobody; closes when idle */
	cancel_cluster(e);
	close_cluster(e);
	for (unsigned i = 0; i < n; i++)
		gs_client_fail(&waiting[i]->client, rc, "job '%s' cannot join its %u nodes: %s",
			       e->settings.job_id, e->settings.nodes, why);
	if (!gs_job_active(&e->job))
		on_idle(e);
}

static struct gs_job_entry *entry_open(struct gs_jobs *t, const struct gs_settings *js,
				       char *why, size_t n)
{
	struct gs_job_entry *e = calloc(1, sizeof(*e));
	if (!e) {
		snprintf(why, n, "out of memory");
		return NULL;
	}
	e->table = t;
	e->settings = *js;
	e->created_ns = gs_now_ns();
	e->backend = t->env.open_backend(&e->settings, why, n);
	if (!e->backend) {
		free(e);
		return NULL;
	}
	int r = gs_worker_start(&e->worker, t->env.loop);
	if (r < 0) {
		snprintf(why, n, "cannot start its worker thread: %s", strerror(-r));
		e->backend->ops->destroy(e->backend);
		free(e);
		return NULL;
	}
	e->worker_started = true;
	struct gs_engine_env env = {
		.loop = t->env.loop,
		.settings = &e->settings,
		.backend = e->backend,
		.worker = &e->worker,
		.trace = t->env.trace,
		.group = { &e->cluster, gs_cluster_agree_layout, gs_cluster_withdraw_layout,
			   gs_cluster_request_regroup, gs_cluster_vote },
		.buffer_takes_fd = t->env.buffer_takes_fd,
		.parse_buffer = t->env.parse_buffer,
		.memory_lost = t->env.memory_lost,
		.idle = on_idle,
		.idle_arg = e,
	};
	gs_job_init(&e->job, &env);
	const struct gs_cluster_parts parts = {
		.loop = t->env.loop,
		.settings = &e->settings,
		.backend = e->backend,
		.worker = &e->worker,
		.job = &e->job,
		.server = t->env.server,
		.port = t->env.port,
	};
	gs_cluster_init(&e->cluster, &parts);
	uv_timer_init(t->env.loop, &e->linger_timer);
	e->linger_timer.data = e;
	uv_timer_init(t->env.loop, &e->free_timer);
	e->free_timer.data = e;
	/* Oldest first, as status lists them. */
	struct gs_job_entry **tail = &t->head;
	while (*tail)
		tail = &(*tail)->next;
	*tail = e;
	t->count++;
	e->state = GS_ENTRY_JOINING;
	e->cluster_started = true;
	if (gs_cluster_start(&e->cluster, on_ready, e) != GS_OK) {
		snprintf(why, n, "cannot start joining its nodes (the daemon's log says why)");
		entry_close(e);
		return NULL;
	}
	gs_info("job '%s' begins: node %u of %u, %u trainers here, backend %s, wire %s, threshold %llu elements",
		e->settings.job_id, e->settings.node_rank, e->settings.nodes, e->settings.local_size,
		e->backend->name, gs_wire_setting_name(e->settings.wire),
		(unsigned long long)e->settings.threshold);
	return e;
}

void gs_jobs_init(struct gs_jobs *t, const struct gs_jobs_env *env)
{
	memset(t, 0, sizeof(*t));
	t->env = *env;
}

/* A new job needs a place: a free one, or that of a job without trainers,
 * whose group goes now rather than at the end of its linger; else the
 * client is refused, naming the limit. */
static bool make_room(struct gs_jobs *t, const struct gs_client *c, const char *id)
{
	struct gs_job_entry *yield;
	char why[200];
	if (!gs_jobs_job_fits(t, c->uid, &yield, why, sizeof(why))) {
		gs_client_fail(c, GS_ELIMIT, "job '%s' cannot begin: %s", id, why);
		return false;
	}
	if (yield) {
		gs_info("job '%s', which has no trainer, gives its place to job '%s': %s",
			yield->settings.job_id, id, why);
		entry_close(yield);
	}
	return true;
}

/* A lingering job whose trainers come back changed (another shape or
 * settings) is not theirs: its group goes, and they begin it anew. Only
 * its owner's trainers may do that: another user's are refused by
 * gs_job_attach, and the lingering group stays. */
static bool lingering_mismatch(const struct gs_job_entry *e, const struct gs_client *c,
			       const Gradsync__Hello *h)
{
	if (!gs_owner_admits(e->settings.owner, e->settings.job_access, c->uid))
		return false;
	char why[GS_COORDINATOR_MAX * 2 + 160];
	if (gs_job_view_differs(&e->settings, e->settings.job_id, h, why, sizeof(why))) {
		gs_info("%s: the lingering job's group goes", why);
		return true;
	}
	return false;
}

struct gs_trainer *gs_jobs_attach(struct gs_jobs *t, const struct gs_client *c,
				  const Gradsync__Hello *h)
{
	const struct gs_settings *node = t->env.settings;
	const char *id = h->job_id ? h->job_id : "";
	if (!gs_job_id_valid(id)) {
		gs_client_fail(c, GS_EINVAL, "job id must be at most %d printable ASCII characters",
			       GS_JOB_ID_MAX);
		return NULL;
	}
	char bad[GS_COORDINATOR_MAX + 300];
	if (gs_hello_check(id, h, bad, sizeof(bad)) < 0) {
		gs_client_fail(c, GS_EINVAL, "%s", bad);
		return NULL;
	}
	if (t->stopping) {
		gs_client_fail(c, GS_EAGAIN, "gradsyncd is shutting down");
		return NULL;
	}
	char refusal[200];
	if (!gs_jobs_trainer_fits(t, c->uid, refusal, sizeof(refusal))) {
		gs_client_fail(c, GS_ELIMIT, "%s", refusal);
		return NULL;
	}
	struct gs_job_entry *e = find(t, id);
	if (e && e->state == GS_ENTRY_LINGERING && lingering_mismatch(e, c, h)) {
		entry_close(e);
		e = NULL;
	}
	bool fresh = e == NULL;
	if (fresh) {
		char why[GS_COORDINATOR_MAX * 2 + 300];
		struct gs_settings js;
		if (gs_job_settings_from_hello(node, id, h, &js, why, sizeof(why)) < 0) {
			gs_client_fail(c, GS_EINVAL, "%s", why);
			return NULL;
		}
		js.owner = c->uid;
		if (!make_room(t, c, id))
			return NULL;
		e = entry_open(t, &js, why, sizeof(why));
		if (!e) {
			gs_client_fail(c, GS_ESYSTEM, "job '%s' cannot begin: %s", id, why);
			return NULL;
		}
	}
	struct gs_trainer *tr = gs_job_attach(&e->job, c, h);
	if (!tr) {
		if (fresh || !gs_job_active(&e->job))
			on_idle(e);
		return NULL;
	}
	uv_timer_stop(&e->linger_timer);
	if (e->state == GS_ENTRY_LINGERING) {
		e->state = GS_ENTRY_READY;
		gs_info("job '%s': a trainer came back: its group of generation %llu serves it again",
			e->settings.job_id, (unsigned long long)e->cluster.member.generation);
	}
	e->welcomed[tr->rank] = false;
	return tr;
}

void gs_jobs_welcome(struct gs_jobs *t, struct gs_trainer *tr)
{
	(void)t;
	struct gs_job_entry *e = gs_jobs_entry_of(tr->job);
	if (e->state == GS_ENTRY_READY && !e->welcomed[tr->rank]) {
		e->welcomed[tr->rank] = true;
		e->table->env.welcome(tr, e);
	}
}

void gs_jobs_detach(struct gs_jobs *t, struct gs_trainer *tr)
{
	(void)t;
	gs_trainer_disconnected(tr);
}

void gs_jobs_cancel(struct gs_jobs *t)
{
	t->stopping = true;
	for (struct gs_job_entry *e = t->head; e; e = e->next)
		if (e->cluster_started)
			gs_cluster_cancel(&e->cluster);
}

void gs_jobs_close(struct gs_jobs *t)
{
	t->stopping = true;
	while (t->head)
		entry_close(t->head);
	while (t->refused)
		entry_close(t->refused);
}
