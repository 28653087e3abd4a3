/*
 * gradsync.proto is the one source of the wire dtype, reduce op and tensor
 * dtype values; the C enums that restate them (kernels/convert.h's
 * gs_wire, support/settings.h's gs_reduce, and the public header's, which
 * client/session.c asserts too) are tied to it here: at compile time,
 * value by value, and at run time, by walking protobuf-c's descriptor of
 * each proto enum so that a value added to the .proto and not to C fails.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"
#include "gradsync.h"
#include "gradsync.pb-c.h"
#include "support/settings.h"

#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " is " #b)
SAME(GS_WIRE_F16, GRADSYNC__WIRE_DTYPE__WIRE_FP16);
SAME(GS_WIRE_BF16, GRADSYNC__WIRE_DTYPE__WIRE_BF16);
SAME(GS_WIRE_F32, GRADSYNC__WIRE_DTYPE__WIRE_FP32);
SAME(GS_WIRE_DTYPE_FP16, GRADSYNC__WIRE_DTYPE__WIRE_FP16);
SAME(GS_WIRE_DTYPE_BF16, GRADSYNC__WIRE_DTYPE__WIRE_BF16);
SAME(GS_WIRE_DTYPE_FP32, GRADSYNC__WIRE_DTYPE__WIRE_FP32);
SAME(GS_REDUCE_AVERAGE, GRADSYNC__REDUCE_OP__OP_AVERAGE);
SAME(GS_REDUCE_SUM, GRADSYNC__REDUCE_OP__OP_SUM);
SAME(GS_OP_AVERAGE, GRADSYNC__REDUCE_OP__OP_AVERAGE);
SAME(GS_OP_SUM, GRADSYNC__REDUCE_OP__OP_SUM);
SAME(GS_FLOAT32, GRADSYNC__DTYPE__DTYPE_FLOAT32);
SAME(GS_UINT8, GRADSYNC__DTYPE__DTYPE_UINT8);
#undef SAME

/* Every value but UNSPECIFIED (0) of a proto enum, one after the other. */
static void each_value(const ProtobufCEnumDescriptor *d, void (*fn)(int v, const char *name))
{
	for (unsigned i = 0; i < d->n_values; i++)
		if (d->values[i].value != 0)
			fn(d->values[i].value, d->values[i].name);
}

static void wire_known(int v, const char *name)
{
	if (gs_wire_size((enum gs_wire)v) == 0)
		fail_msg("gradsync.proto's %s (%d) is no enum gs_wire of kernels/convert.h", name, v);
}

static void op_known(int v, const char *name)
{
	if (v != GS_REDUCE_AVERAGE && v != GS_REDUCE_SUM)
		fail_msg("gradsync.proto's %s (%d) is no enum gs_reduce of settings.h", name, v);
}

static void every_proto_wire_dtype_is_a_gs_wire(void **state)
{
	(void)state;
	each_value(&gradsync__wire_dtype__descriptor, wire_known);
}

static void every_proto_reduce_op_is_a_gs_reduce(void **state)
{
	(void)state;
	each_value(&gradsync__reduce_op__descriptor, op_known);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_proto_wire_dtype_is_a_gs_wire),
		cmocka_unit_test(every_proto_reduce_op_is_a_gs_reduce),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
