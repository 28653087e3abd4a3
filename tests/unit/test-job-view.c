/*
 * A trainer's view of its job against the job's settings, without a
 * daemon: which fields are compared, when, and the words of a difference.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/job_view.h"

static void job(struct gs_settings *s)
{
	memset(s, 0, sizeof(*s));
	s->local_size = 4;
	s->nodes = 2;
	s->node_rank = 1;
	snprintf(s->coordinator, sizeof(s->coordinator), "[fe80::1]:29500");
	s->threshold = 65536;
	s->wire = 2;  /* bf16 */
	s->op = 1;    /* average */
	s->predivide = 0; /* the world size */
	s->fusion_elements = 8192;
}

/* The words for h, or "" when h agrees. */
static const char *verdict(const struct gs_settings *s, const Gradsync__Hello *h)
{
	static char err[600];
	err[0] = '\0';
	bool d = gs_job_view_differs(s, "j", h, err, sizeof(err));
	assert_int_equal(d, err[0] != '\0');
	return err;
}

static void unset_fields_are_not_compared(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	assert_string_equal(verdict(&s, &h), "");
}

static void agreeing_fields_pass(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	Gradsync__UInt64Value rank = GRADSYNC__UINT64_VALUE__INIT, thr = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__DoubleValue pre = GRADSYNC__DOUBLE_VALUE__INIT;
	rank.value = 1;
	thr.value = 65536;
	pre.value = 0;
	h.local_size = 4;
	h.nodes = 2;
	h.node_rank = &rank;
	h.coordinator = "FE80::1"; /* case aside, without the brackets */
	h.threshold = &thr;
	h.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_BF16;
	h.op = GRADSYNC__REDUCE_OP__OP_AVERAGE;
	h.predivide_factor = &pre;
	h.fusion_buffer_elements = 8192;
	assert_string_equal(verdict(&s, &h), "");
	h.coordinator = "[fe80::1]";
	assert_string_equal(verdict(&s, &h), "");
}

static void each_difference_is_named(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	Gradsync__UInt64Value v = GRADSYNC__UINT64_VALUE__INIT;
	Gradsync__DoubleValue pre = GRADSYNC__DOUBLE_VALUE__INIT;
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;

	h.local_size = 8;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says local size 8, the job has 4 (gradsyncd's --local-size)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.nodes = 3;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says node count 3, the job has 2 (gradsyncd's --nodes)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	v.value = 0; /* 0 is a value: a node rank, sent */
	h.node_rank = &v;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says node rank 0, the job has 1 (gradsyncd's --node-rank)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.coordinator = "fe80::2";
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says coordinator 'fe80::2', the job has 'fe80::1' (gradsyncd's --coordinator)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	v.value = 0;
	h.threshold = &v;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says threshold 0, the job has 65536 (gradsyncd's --threshold)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.wire_dtype = GRADSYNC__WIRE_DTYPE__WIRE_FP32;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says wire dtype fp32, the job has bf16 (gradsyncd's --wire)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.wire_dtype = (Gradsync__WireDtype)77; /* a raw client's: named, not indexed */
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says wire dtype unknown, the job has bf16 (gradsyncd's --wire)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.op = GRADSYNC__REDUCE_OP__OP_SUM;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says op sum, the job has average (gradsyncd's --op)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	pre.value = 2;
	h.predivide_factor = &pre;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says predivide 2, the job has world (gradsyncd's --predivide)");
	h = (Gradsync__Hello)GRADSYNC__HELLO__INIT;
	h.fusion_buffer_elements = 1024;
	assert_string_equal(verdict(&s, &h),
			    "job 'j': this trainer says fusion buffer 1024, the job has 8192 (gradsyncd's --fusion-buffer)");
}

/* A job of one node has no coordinator to agree on. */
static void one_node_skips_the_coordinator(void **state)
{
	(void)state;
	struct gs_settings s;
	job(&s);
	s.nodes = 1;
	s.node_rank = 0;
	s.coordinator[0] = '\0';
	Gradsync__Hello h = GRADSYNC__HELLO__INIT;
	h.coordinator = "anywhere";
	assert_string_equal(verdict(&s, &h), "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(unset_fields_are_not_compared),
		cmocka_unit_test(agreeing_fields_pass),
		cmocka_unit_test(each_difference_is_named),
		cmocka_unit_test(one_node_skips_the_coordinator),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
