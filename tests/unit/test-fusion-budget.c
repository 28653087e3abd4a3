/*
 * The node's budget of fusion memory (backend/fusion_budget.h): holders'
 * shares add up, a share that would pass the limit is refused with the
 * words a trainer sees, one that shrinks always goes through, and what a
 * holder gives back another can take.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include "backend/fusion_budget.h"
#include "errors.h"

static void test_shares_add_up_to_the_limit(void **state)
{
	(void)state;
	struct gs_fusion_budget b;
	gs_fusion_budget_init(&b, 1000);
	uint64_t x = 0, y = 0;
	char why[300] = "";
	assert_int_equal(gs_fusion_budget_resize(&b, &x, 600, why, sizeof(why)), GS_OK);
	assert_int_equal(x, 600);
	/* Exactly to the limit is within it. */
	assert_int_equal(gs_fusion_budget_resize(&b, &y, 400, why, sizeof(why)), GS_OK);
	assert_int_equal(gs_fusion_budget_used(&b), 1000);
	/* A holder may grow into what is its own, and no further. */
	assert_int_equal(gs_fusion_budget_resize(&b, &y, 401, why, sizeof(why)), GS_ELIMIT);
	assert_int_equal(y, 400);
	assert_int_equal(gs_fusion_budget_used(&b), 1000);
	assert_string_equal(why, "its fusion buffers need 401 bytes, more than this node's fusion memory has free (--max-fusion-memory=1000 bytes, 600 in use by other jobs)");
	/* Shrinking always goes through; what it frees, another takes. */
	assert_int_equal(gs_fusion_budget_resize(&b, &x, 100, why, sizeof(why)), GS_OK);
	assert_int_equal(gs_fusion_budget_resize(&b, &y, 900, why, sizeof(why)), GS_OK);
	assert_int_equal(gs_fusion_budget_used(&b), 1000);
	assert_int_equal(gs_fusion_budget_resize(&b, &x, 0, why, sizeof(why)), GS_OK);
	assert_int_equal(gs_fusion_budget_resize(&b, &y, 0, why, sizeof(why)), GS_OK);
	assert_int_equal(gs_fusion_budget_used(&b), 0);
}

/* A share larger than the whole budget is refused even with nobody else
 * holding anything, and no sum wraps around. */
static void test_more_than_the_whole_budget(void **state)
{
	(void)state;
	struct gs_fusion_budget b;
	gs_fusion_budget_init(&b, 1000);
	uint64_t x = 0;
	char why[300];
	assert_int_equal(gs_fusion_budget_resize(&b, &x, 1001, why, sizeof(why)), GS_ELIMIT);
	assert_int_equal(gs_fusion_budget_resize(&b, &x, UINT64_MAX, why, sizeof(why)), GS_ELIMIT);
	assert_int_equal(x, 0);
	assert_int_equal(gs_fusion_budget_used(&b), 0);
	assert_non_null(strstr(why, "need 18446744073709551615 bytes"));
}

static void test_no_budget_no_limit(void **state)
{
	(void)state;
	uint64_t x = 0;
	char why[8];
	assert_int_equal(gs_fusion_budget_resize(NULL, &x, UINT64_MAX, why, sizeof(why)), GS_OK);
	assert_int_equal(x, UINT64_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shares_add_up_to_the_limit),
		cmocka_unit_test(test_more_than_the_whole_budget),
		cmocka_unit_test(test_no_budget_no_limit),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
