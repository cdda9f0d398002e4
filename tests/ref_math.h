/*
 * ref_math.h: reference arithmetic for the C tests (header only), written
 * from the definitions rather than from the code under test: exact f16 and
 * bf16 decoders in double, and the engine's fixed accumulation order of a
 * dot product (engine_int.h) in plain scalar f32.
 */
#ifndef BATON_TESTS_REF_MATH_H
#define BATON_TESTS_REF_MATH_H

#include <math.h>
#include <stdint.h>

/* A test uses some of these, not all. */
__attribute__((unused)) static double ref_f16(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v;

	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return (h & 0x8000) ? -v : v;
}

__attribute__((unused)) static double ref_bf16(uint16_t h)
{
	int e = (h >> 7) & 255, m = h & 127;
	double v;

	if (e == 255)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -133);
	else
		v = ldexp(128 + m, e - 134);
	return (h & 0x8000) ? -v : v;
}

/* 32 lanes, then halving pairwise (16, 8, 4, then (0+2)+(1+3)), then the
 * tail in order: the order every backend's dot keeps. */
__attribute__((unused)) static float canon_dot(const float *w, const float *x, uint32_t n)
{
	float acc[32] = { 0 }, b[16], c[8], d[4];
	uint32_t n32 = n & ~31u;

	for (uint32_t i = 0; i < n32; i++)
		acc[i % 32] += w[i] * x[i];
	for (int l = 0; l < 16; l++)
		b[l] = acc[l] + acc[l + 16];
	for (int l = 0; l < 8; l++)
		c[l] = b[l] + b[l + 8];
	for (int l = 0; l < 4; l++)
		d[l] = c[l] + c[l + 4];
	float s = (d[0] + d[2]) + (d[1] + d[3]);
	for (uint32_t i = n32; i < n; i++)
		s += w[i] * x[i];
	return s;
}

#endif
