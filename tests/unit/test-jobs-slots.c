/*
 * The policy of places on a node (daemon/jobs/slots.c), without a daemon:
 * a table of jobs given only what the policy reads (owners, trainers'
 * uids, states, linger timers on a loop of the test's that never runs),
 * and the answers checked against the rules as the settings state them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/trainer.h"
#include "jobs/jobs.h"

struct fixture {
	uv_loop_t loop;
	struct gs_settings settings;
	struct gs_jobs table;
};

static int setup(void **state)
{
	static struct fixture f;
	memset(&f, 0, sizeof(f));
	assert_int_equal(uv_loop_init(&f.loop), 0);
	f.settings.max_jobs = 4;
	f.settings.max_trainers = 10;
	f.settings.max_jobs_per_user = 2;
	f.settings.max_trainers_per_user = 3;
	f.table.env.settings = &f.settings;
	*state = &f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	for (struct gs_job_entry *e = f->table.head; e; e = e->next)
		uv_close((uv_handle_t *)&e->linger_timer, NULL);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	while (f->table.head) {
		struct gs_job_entry *e = f->table.head;
		f->table.head = e->next;
		for (unsigned r = 0; r < GS_MAX_LOCAL; r++)
			free(e->job.slots[r]);
		free(e);
	}
	assert_int_equal(uv_loop_close(&f->loop), 0);
	return 0;
}

static void never(uv_timer_t *t)
{
	(void)t;
	fail_msg("the test's loop never runs its timers");
}

/* A job of owner's with trainers of the given uids (n of them), added to
 * the table; linger_ms >= 0: it has no trainer and its linger ends then
 * (lingering: the state says so; else going at once, as a job of one
 * node). */
static struct gs_job_entry *add_job(struct fixture *f, uid_t owner, const uid_t *uids,
				    unsigned n, long linger_ms, bool lingering)
{
	struct gs_job_entry *e = calloc(1, sizeof(*e));
	assert_non_null(e);
	e->state = lingering ? GS_ENTRY_LINGERING : GS_ENTRY_READY;
	e->settings.owner = owner;
	for (unsigned r = 0; r < n; r++) {
		e->job.slots[r] = calloc(1, sizeof(struct gs_trainer));
		assert_non_null(e->job.slots[r]);
		e->job.slots[r]->uid = uids[r];
	}
	e->job.attached = n;
	uv_timer_init(&f->loop, &e->linger_timer);
	if (linger_ms >= 0)
		uv_timer_start(&e->linger_timer, never, (uint64_t)linger_ms, 0);
	struct gs_job_entry **tail = &f->table.head;
	while (*tail)
		tail = &(*tail)->next;
	*tail = e;
	f->table.count++;
	return e;
}

static const uid_t ALICE = 1000, BOB = 1001, CAROL = 1002, DAVE = 1003;

static void trainers_per_user_and_node(void **state)
{
	struct fixture *f = *state;
	char why[200];
	add_job(f, ALICE, (uid_t[]){ ALICE, ALICE }, 2, -1, false);
	/* Another user's job Alice joined (--job-access=any): her trainer
	 * counts as hers. */
	add_job(f, BOB, (uid_t[]){ BOB, ALICE }, 2, -1, false);
	assert_false(gs_jobs_trainer_fits(&f->table, ALICE, why, sizeof(why)));
	assert_string_equal(why, "uid 1000 has 3 trainers on this node already, its most (--max-trainers-per-user)");
	assert_true(gs_jobs_trainer_fits(&f->table, BOB, why, sizeof(why)));
	f->settings.max_trainers_per_user = 0; /* none */
	assert_true(gs_jobs_trainer_fits(&f->table, ALICE, why, sizeof(why)));
	f->settings.max_trainers = 4;
	assert_false(gs_jobs_trainer_fits(&f->table, BOB, why, sizeof(why)));
	assert_string_equal(why, "this node serves 4 trainers already, its most (--max-trainers)");
}

/* A user at its share gives up its own job without trainers (the one
 * lingering longest), even where another user's would end sooner; a
 * user with none is refused. Root counts as any user. */
static void a_user_at_its_share(void **state)
{
	struct fixture *f = *state;
	char why[200];
	struct gs_job_entry *yield;
	add_job(f, ALICE, (uid_t[]){ ALICE }, 1, -1, false);
	add_job(f, BOB, NULL, 0, 5000, true);
	struct gs_job_entry *old = add_job(f, ALICE, NULL, 0, 50000, true);
	struct gs_job_entry *older = add_job(f, ALICE, NULL, 0, 40000, true);
	f->settings.max_jobs_per_user = 3;
	assert_true(gs_jobs_job_fits(&f->table, ALICE, &yield, why, sizeof(why)));
	assert_ptr_equal(yield, older);
	assert_string_equal(why, "uid 1000 has 3 jobs on this node already, its most (--max-jobs-per-user)");
	(void)old;
	/* Carol has no job: a place is free. */
	f->settings.max_jobs = 8;
	f->settings.max_jobs_per_user = 1;
	assert_true(gs_jobs_job_fits(&f->table, CAROL, &yield, why, sizeof(why)));
	assert_null(yield);
	/* Root's one job has a trainer: refused. */
	add_job(f, 0, (uid_t[]){ 0 }, 1, -1, false);
	assert_false(gs_jobs_job_fits(&f->table, 0, &yield, why, sizeof(why)));
	assert_null(yield);
	assert_string_equal(why, "uid 0 has 1 jobs on this node already, its most (--max-jobs-per-user)");
	f->settings.max_jobs_per_user = 0; /* none */
	assert_true(gs_jobs_job_fits(&f->table, 0, &yield, why, sizeof(why)));
	assert_null(yield);
}

/* The node full: the job without trainers nearest its end gives way,
 * whoever's; a job of one node going at once is nearest of all. With
 * none, the new job is refused naming --max-jobs. */
static void the_node_full(void **state)
{
	struct fixture *f = *state;
	char why[200];
	struct gs_job_entry *yield;
	f->settings.max_jobs_per_user = 0;
	add_job(f, ALICE, (uid_t[]){ ALICE }, 1, -1, false);
	add_job(f, ALICE, NULL, 0, 50000, true);
	struct gs_job_entry *bobs = add_job(f, BOB, NULL, 0, 5000, true);
	struct gs_job_entry *carols = add_job(f, CAROL, (uid_t[]){ CAROL }, 1, -1, false);
	assert_true(gs_jobs_job_fits(&f->table, DAVE, &yield, why, sizeof(why)));
	assert_ptr_equal(yield, bobs);
	assert_string_equal(why, "this node serves 4 jobs already, its most (--max-jobs)");
	/* Carol's trainer left; her job of one node goes in this turn of
	 * the loop. */
	free(carols->job.slots[0]);
	carols->job.slots[0] = NULL;
	carols->job.attached = 0;
	uv_timer_start(&carols->linger_timer, never, 0, 0);
	assert_true(gs_jobs_job_fits(&f->table, DAVE, &yield, why, sizeof(why)));
	assert_ptr_equal(yield, carols);
	/* Room: nobody gives way. */
	f->settings.max_jobs = 5;
	assert_true(gs_jobs_job_fits(&f->table, DAVE, &yield, why, sizeof(why)));
	assert_null(yield);
}

static void the_node_full_of_working_jobs(void **state)
{
	struct fixture *f = *state;
	char why[200];
	struct gs_job_entry *yield;
	for (uid_t u = 0; u < 4; u++)
		add_job(f, ALICE + u, (uid_t[]){ ALICE + u }, 1, -1, false);
	assert_false(gs_jobs_job_fits(&f->table, DAVE + 1, &yield, why, sizeof(why)));
	assert_null(yield);
	assert_string_equal(why, "this node serves 4 jobs already, its most (--max-jobs)");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(trainers_per_user_and_node, setup, teardown),
		cmocka_unit_test_setup_teardown(a_user_at_its_share, setup, teardown),
		cmocka_unit_test_setup_teardown(the_node_full, setup, teardown),
		cmocka_unit_test_setup_teardown(the_node_full_of_working_jobs, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
