/*
 * gemm.cu: the small kernels around the tensor-core GEMMs of tc_launch.c
 * (argument blocks in tc.h): weights of every dtype decoded to bf16,
 * f32 activation rows to bf16 (gathered through a map for the MoE
 * experts), the bias, SwiGLU from a GEMM's f32 output to bf16, and the
 * experts' outputs scattered, weighted, to their pairs. Not the host's
 * order: these feed cuBLAS, whose sums are its own (docs/internals/cuda-ops.md,
 * "Prefill on the tensor cores").
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/tc.h"

static_assert(sizeof(baton_tc_dequant_args) == 72, "dequant args layout");
static_assert(sizeof(baton_tc_rows_args) == 40, "rows args layout");
static_assert(sizeof(baton_tc_bias_args) == 32, "bias args layout");
static_assert(sizeof(baton_tc_swiglu_args) == 24, "swiglu args layout");
static_assert(sizeof(baton_tc_scatter_args) == 40, "scatter args layout");

__device__ __forceinline__ uint32_t bf_bits(float a)
{
	return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a));
}

__device__ __forceinline__ uint32_t bf_pair(float a, float b)
{
	return bf_bits(a) | (bf_bits(b) << 16);
}

__device__ __forceinline__ void store8(unsigned short *dst, const float v[8])
{
	uint4 o;
	o.x = bf_pair(v[0], v[1]);
	o.y = bf_pair(v[2], v[3]);
	o.z = bf_pair(v[4], v[5]);
	o.w = bf_pair(v[6], v[7]);
	*(uint4 *)dst = o;
}

/* Eight elements e0 .. e0 + 7 of a row (e0 % 8 == 0). */
__device__ __forceinline__ void decode8(const uint8_t *row, uint32_t dt, uint32_t e0, uint32_t vec,
    float v[8])
{
	if (vec) {
		switch (dt) {
		case BATON_DT_Q4_K:
			kq_w8<BATON_DT_Q4_K>(row + (uint64_t)(e0 / 256) * 144, (e0 % 256) / 8, v);
			return;
		case BATON_DT_Q5_K:
			kq_w8<BATON_DT_Q5_K>(row + (uint64_t)(e0 / 256) * 176, (e0 % 256) / 8, v);
			return;
		case BATON_DT_Q6_K:
			kq_w8<BATON_DT_Q6_K>(row + (uint64_t)(e0 / 256) * 210, (e0 % 256) / 8, v);
			return;
		case BATON_DT_Q8_0: {
			const uint8_t *b = row + (uint64_t)(e0 / 32) * 34;
			const float d = f16f(__ldg((const unsigned short *)b));
			const unsigned short *q = (const unsigned short *)(b + 2 + e0 % 32);
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const uint32_t u = __ldg(q + i);
				v[2 * i] = d * (float)(int8_t)(u & 0xff);
				v[2 * i + 1] = d * (float)(int8_t)(u >> 8);
			}
			return;
		}
		case BATON_DT_F16:
		case BATON_DT_BF16: {
			const unsigned short *p = (const unsigned short *)(row + 2ull * e0);
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const uint32_t u = __ldg(p + i);
				v[i] = dt == BATON_DT_F16 ? f16f(u) : bf16f(u);
			}
			return;
		}
		}
	}
#pragma unroll
	for (int i = 0; i < 8; i++)
		v[i] = elem(row, dt, e0 + i);
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_dequant(const baton_tc_dequant_args a)
{
	const uint32_t per_row = a.cols / 8;
	const uint64_t units = (uint64_t)a.rows * per_row;
	const uint32_t z = blockIdx.y;
	const uint8_t *base = (const uint8_t *)(a.table ? ((const uint64_t *)a.table)[z] : a.src) +
	    a.src_off;
	unsigned short *dst = (unsigned short *)a.dst + (uint64_t)z * a.dst_stride +
	    a.dst_row0 * a.cols;
	for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
	     u += (uint64_t)gridDim.x * blockDim.x) {
		const uint64_t r = u / per_row;
		const uint32_t e0 = (uint32_t)(u % per_row) * 8;
		float v[8];
		decode8(base + r * a.row_bytes, a.dtype, e0, a.vec, v);
		store8(dst + r * a.cols + e0, v);
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_rows(const baton_tc_rows_args a)
{
	const uint32_t per_row = a.cols / 8;
	const uint64_t units = (uint64_t)a.rows * per_row;
	const uint32_t *map = (const uint32_t *)a.map;
	for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
	     u += (uint64_t)gridDim.x * blockDim.x) {
		const uint64_t r = u / per_row;
		const uint32_t c = (uint32_t)(u % per_row) * 8;
		float v[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
		const uint32_t m = map ? map[r] : (uint32_t)r;
		if (m != BATON_TC_NONE) {
			const float *s = (const float *)a.src + (uint64_t)(map ? m / a.div : m) * a.src_ld + c;
#pragma unroll
			for (int i = 0; i < 8; i++)
				v[i] = s[i];
		}
		store8((unsigned short *)a.dst + r * a.cols + c, v);
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_bias(const baton_tc_bias_args a)
{
	const uint64_t n = (uint64_t)a.rows * a.n_out;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		((float *)a.y)[i] += elem((const uint8_t *)a.b, a.b_dtype, (uint32_t)(i % a.n_out));
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_swiglu(const baton_tc_swiglu_args a)
{
	const uint64_t n = (uint64_t)a.rows * a.f;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		const uint64_t r = i / a.f, c = i % a.f;
		const float *gu = (const float *)a.gu + r * 2 * a.f;
		const float g = gu[c], u = gu[a.f + c];
		((unsigned short *)a.h)[i] = (unsigned short)bf_bits(g / (1.0f + expf(-g)) * u);
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_scatter(const baton_tc_scatter_args a)
{
	const uint64_t n = (uint64_t)a.rows * a.cols;
	const uint32_t *map = (const uint32_t *)a.map;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		const uint64_t r = i / a.cols, c = i % a.cols;
		const uint32_t p = map[r];
		if (p == BATON_TC_NONE)
			continue;
		((float *)a.part)[(uint64_t)p * a.cols + c] =
		    ((const float *)a.w)[p] * ((const float *)a.o)[i];
	}
}
