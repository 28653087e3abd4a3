/*
 * Every state name gradsyncd can send, walked: status and the clients'
 * list carry them in fixed char arrays of the public API (struct
 * gs_job_status and its friends, which may not grow without a new
 * soversion), so a name that does not fit reaches gradsyncctl cut ("agreeing
 * on the layout with the" was one). Each table is checked whole against
 * the size of the field that carries it, read from gradsync.h itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/cluster.h"
#include "control/control.h"
#include "convert.h"
#include "engine/job.h"
#include "engine/trainer.h"
#include "gradsync.h"
#include "jobs/jobs.h"

#define ROOM(type, field) sizeof(((type *)0)->field)
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Each of names[0..n) is set and fits room bytes with its NUL. */
static void all_fit(const char *what, const char *const *names, size_t n, size_t room)
{
	assert_true(n > 0);
	for (size_t i = 0; i < n; i++) {
		if (!names[i])
			fail_msg("%s state %zu has no name", what, i);
		print_message("%s: '%s' (%zu of %zu bytes)\n", what, names[i], strlen(names[i]) + 1,
			      room);
		if (strlen(names[i]) >= room)
			fail_msg("%s state '%s' is %zu bytes long: the public API holds %zu", what,
				 names[i], strlen(names[i]), room - 1);
	}
}

static void job_states(void **state)
{
	(void)state;
	/* A job's state goes to gs_job_status.state and, for the node's
	 * first job, gs_status.job_state: the smaller decides. */
	size_t room = ROOM(struct gs_job_status, state) < ROOM(struct gs_status, job_state)
			      ? ROOM(struct gs_job_status, state)
			      : ROOM(struct gs_status, job_state);
	all_fit("job", gs_job_state_names, COUNT(gs_job_state_names), room);
	all_fit("job entry", gs_entry_state_names, COUNT(gs_entry_state_names), room);
}

static void trainer_states(void **state)
{
	(void)state;
	/* In status, and in the clients' list as its connection's state. */
	all_fit("trainer", gs_trainer_state_names, COUNT(gs_trainer_state_names),
		ROOM(struct gs_trainer_status, state));
	all_fit("trainer connection", gs_trainer_state_names, COUNT(gs_trainer_state_names),
		ROOM(struct gs_connection_status, state));
}

static void peer_states(void **state)
{
	(void)state;
	all_fit("peer", gs_peer_state_names, COUNT(gs_peer_state_names),
		ROOM(struct gs_peer_status, state));
}

static void connection_states_and_roles(void **state)
{
	(void)state;
	all_fit("connection", gs_client_state_names, COUNT(gs_client_state_names),
		ROOM(struct gs_connection_status, state));
	all_fit("connection role", gs_conn_role_names, COUNT(gs_conn_role_names),
		ROOM(struct gs_connection_status, role));
}

/* Not a state, but carried the same way: the conversion kernels' name. */
static void isa_names(void **state)
{
	(void)state;
	const char *names[8];
	size_t n = 0;
	for (int isa = 0; n < COUNT(names) && strcmp(gs_isa_name((enum gs_isa)isa), "unknown") != 0;
	     isa++)
		names[n++] = gs_isa_name((enum gs_isa)isa);
	all_fit("isa", names, n, ROOM(struct gs_status, isa));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(job_states),
		cmocka_unit_test(trainer_states),
		cmocka_unit_test(peer_states),
		cmocka_unit_test(connection_states_and_roles),
		cmocka_unit_test(isa_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
