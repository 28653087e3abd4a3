/*
 * Wire dtypes, ISA selection and the public entry points, which dispatch
 * to the kernels of the active ISA. The ISA is chosen once, at first use:
 * the best the CPU has, unless GRADSYNC_ISA names another one it has, or a
 * test or benchmark forces one.
 */
#include <cpuid.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "convert_impl.h"

size_t gs_wire_size(enum gs_wire w)
{
	switch (w) {
	case GS_WIRE_F16:
	case GS_WIRE_BF16:
		return 2;
	case GS_WIRE_F32:
		return 4;
	}
	return 0;
}

const char *gs_wire_name(enum gs_wire w)
{
	switch (w) {
	case GS_WIRE_F16:
		return "fp16";
	case GS_WIRE_BF16:
		return "bf16";
	case GS_WIRE_F32:
		return "fp32";
	}
	return "unknown";
}

/* ----------------------------------------------------------------- ISA */

static const char *const isa_names[] = {
	[GS_ISA_SCALAR] = "scalar",
	[GS_ISA_F16C] = "f16c",
	[GS_ISA_AVX512] = "avx512",
};

static const struct gs_convert_ops *const isa_ops[] = {
	[GS_ISA_SCALAR] = &gs_convert_scalar,
	[GS_ISA_F16C] = &gs_convert_f16c,
	[GS_ISA_AVX512] = &gs_convert_avx512,
};

#define NISA (sizeof(isa_names) / sizeof(isa_names[0]))

/* -1 until first use. */
static _Atomic int active_isa = -1;

/* Clang before 16 has no "f16c" for __builtin_cpu_supports; CPUID leaf 1
 * says it directly (the OS support it needs is AVX's, checked with AVX2). */
static bool cpu_has_f16c(void)
{
	unsigned a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* __builtin_cpu_supports also checks that the OS saves the AVX and
 * AVX-512 register state, not just the CPUID bits. */
static bool isa_supported(enum gs_isa isa)
{
	__builtin_cpu_init();
	switch (isa) {
	case GS_ISA_SCALAR:
		return true;
	case GS_ISA_F16C:
		/* The kernels are built with -mavx2 -mf16c, which lets the
		 * compiler use POPCNT too. */
		return __builtin_cpu_supports("avx2") && cpu_has_f16c() &&
		       __builtin_cpu_supports("popcnt");
	case GS_ISA_AVX512:
		return isa_supported(GS_ISA_F16C) &&
		       __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl");
	}
	return false;
}

enum gs_isa gs_isa_detect(void)
{
	if (isa_supported(GS_ISA_AVX512))
		return GS_ISA_AVX512;
	if (isa_supported(GS_ISA_F16C))
		return GS_ISA_F16C;
	return GS_ISA_SCALAR;
}

/* GRADSYNC_ISA lets an operator or a benchmark pin a path without code;
 * a value that is unknown or that this CPU lacks is ignored. */
static enum gs_isa initial_isa(void)
{
	const char *want = getenv("GRADSYNC_ISA");

	if (want) {
		for (size_t i = 0; i < NISA; i++)
			if (!strcmp(want, isa_names[i]) &&
			    isa_supported((enum gs_isa)i))
				return (enum gs_isa)i;
	}
	return gs_isa_detect();
}

enum gs_isa gs_isa_active(void)
{
	int isa = atomic_load_explicit(&active_isa, memory_order_relaxed);
	int unset = -1;

	if (isa >= 0)
		return (enum gs_isa)isa;
	/* Racing first callers compute the same answer; a concurrent
	 * gs_isa_force wins over it. */
	isa = (int)initial_isa();
	if (!atomic_compare_exchange_strong(&active_isa, &unset, isa))
		isa = unset;
	return (enum gs_isa)isa;
}

const char *gs_isa_name(enum gs_isa isa)
{
	if ((unsigned)isa >= NISA)
		return "unknown";
	return isa_names[isa];
}

bool gs_isa_force(enum gs_isa isa)
{
	if ((unsigned)isa >= NISA || !isa_supported(isa))
		return false;
	atomic_store(&active_isa, (int)isa);
	return true;
}

static const struct gs_convert_ops *ops(void)
{
	return isa_ops[gs_isa_active()];
}

/* ------------------------------------------------------------- kernels */

uint64_t gs_pack(enum gs_wire w, void *dst, const float *src, size_t n,
		 const struct gs_pack_params *p)
{
	static const struct gs_pack_params plain = { .prescale = 1.0f };

	if (!gs_wire_size(w))
		return 0;
	return ops()->pack(w, dst, src, n, p ? p : &plain);
}

void gs_reduce_sum(enum gs_wire w, void *dst, const void *const *srcs,
		   size_t nsrc, size_t n)
{
	size_t size = gs_wire_size(w);

	if (!size)
		return;
	/* The empty sum is zero, which is all-zero bits in every dtype. */
	if (nsrc == 0) {
		memset(dst, 0, n * size);
		return;
	}
	ops()->reduce_sum(w, dst, srcs, nsrc, n);
}

/* Bytes of packed sources a gs_pack_sum tile holds: well inside the L1
 * data cache of current x86 cores, next to the streams it reads. */
#define PACK_SUM_TILE_BYTES 16384

/* One tile: pack every source into its row of the scratch, then sum the
 * rows into dst. Being gs_pack and gs_reduce_sum themselves, tile by
 * tile, it gives their bits by construction. */
static void pack_sum_tile(const struct gs_convert_ops *o, enum gs_wire w,
			  char *dst, const float *const *srcs, size_t nsrc,
			  size_t from, size_t n, const struct gs_pack_params *p,
			  uint64_t *clipped, char *scratch, size_t row,
			  const void **rows)
{
	static const struct gs_pack_params plain = { .prescale = 1.0f };

	for (size_t k = 0; k < nsrc; k++) {
		uint64_t c = o->pack(w, scratch + k * row, srcs[k] + from, n,
				     p ? &p[k] : &plain);

		if (clipped)
			clipped[k] += c;
		rows[k] = scratch + k * row;
	}
	o->reduce_sum(w, dst + from * gs_wire_size(w), rows, nsrc, n);
}

int gs_pack_sum(enum gs_wire w, void *dst, const float *const *srcs,
		size_t nsrc, size_t n, const struct gs_pack_params *p,
		uint64_t *clipped)
{
	size_t size = gs_wire_size(w);

	if (!size || nsrc > GS_PACK_SUM_MAX_SOURCES)
		return -1;
	if (nsrc == 0) {
		memset(dst, 0, n * size);
		return 0;
	}
	/* One source: round(widen(round(x))) is round(x), NaN payloads
	 * included, so the sum is the pack itself. */
	if (nsrc == 1) {
		uint64_t c = gs_pack(w, dst, srcs[0], n, p);

		if (clipped)
			clipped[0] += c;
		return 0;
	}
	/* Elements per tile, a multiple of 64 so that the vector loops have
	 * no tail but the last; with at most 64 sources of at most 4 bytes
	 * a tile holds at least 64 elements. */
	size_t tile = (PACK_SUM_TILE_BYTES / (nsrc * size)) & ~(size_t)63;
	_Alignas(64) char scratch[PACK_SUM_TILE_BYTES];
	const void *rows[GS_PACK_SUM_MAX_SOURCES];

	for (size_t i = 0; i < n; i += tile)
		pack_sum_tile(ops(), w, dst, srcs, nsrc, i,
			      n - i < tile ? n - i : tile, p, clipped, scratch,
			      tile * size, rows);
	return 0;
}

uint64_t gs_unpack(enum gs_wire w, float *const *dsts, size_t ndst,
		   const void *src, size_t n, float postscale)
{
	if (!gs_wire_size(w))
		return 0;
	return ops()->unpack(w, dsts, ndst, src, n, postscale);
}

/* The call's pieces one by one; each streams, where its destinations
 * allow, if the whole call would (a long tensor's pieces are short). */
uint64_t gs_unpack_norm(enum gs_wire w, float *const *dsts, size_t ndst,
			const void *src, size_t n, float postscale,
			uint64_t first, double *blocks)
{
	const struct gs_convert_ops *o = ops();
	bool stream = n >= GS_UNPACK_STREAM_MIN;
	uint64_t nonfinite = 0;

	if (!gs_wire_size(w))
		return 0;
	for (size_t i = 0; i < n;) {
		uint64_t at = first + i;
		size_t len = GS_NORM_BLOCK - (size_t)(at % GS_NORM_BLOCK);
		double sumsq;

		if (len > n - i)
			len = n - i;
		nonfinite += o->unpack_norm(w, dsts, ndst, src, i, i + len,
					    postscale, stream, &sumsq);
		blocks[at / GS_NORM_BLOCK] += sumsq;
		i += len;
	}
	return nonfinite;
}

void gs_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
	ops()->f32_to_f16(dst, src, n);
}

void gs_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	ops()->f16_to_f32(dst, src, n);
}

void gs_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
	ops()->f32_to_bf16(dst, src, n);
}

void gs_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	ops()->bf16_to_f32(dst, src, n);
}
