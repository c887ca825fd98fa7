/* meshd's 4-bit product as an onnxruntime custom operator (domain "meshd", op "MatMulQ4").

   Y[..., N] = X[..., K] @ W.T, where W's row n, block b of 32 values is
       w = scale[n, b] * q + min[n, b],   q in 0..15
   (GGUF's Q4_1, and Q4_K re-blocked to 32 with its sub-block scales and minimums).

   Inputs: X float [..., K]; Q uint8 [N, K/32, 16], two codes a byte, the even one low (the
   layout MatMulNBits reads, so one stored tensor serves both); S float16 [N, K/32] (scales);
   M float16 [N, K/32] (minimums). A block is read as 16 + 2 + 2 = 20 bytes, as llama.cpp reads
   Q4_1; onnxruntime's MatMulNBits packs 24 (fp32 scale and block sum) and needs the minimums as
   a second product.

   Each row of X is rounded to int8 per block of 32 (step: the block's largest magnitude / 127,
   as MatMulNBits' accuracy_level 4 does), its codes stored in the order the weight nibbles
   unpack to (even values, then odd ones), so a block's dot product is one pass of u8 x s8
   multiply-adds; the minimums' term is min * (step * sum of the codes). The output rows n are
   split over onnxruntime's intra-op threads (KernelContext_ParallelFor); each task runs up to
   ROWS rows of X against each weight block, unpacked once (8 rows, one column at a time:
   measured faster than 4 rows, or 2 columns sharing the rows' loads).

   Built by meshd.engine.q4kernel with the machine's compiler (-march=native), against
   onnxruntime's C API header; the vector path is chosen at compile time (AVX-512 VNNI, AVX-VNNI,
   AVX2, or plain C). Errors come back as onnxruntime statuses (the V2 entry points). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "onnxruntime_c_api.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define MESHD_X86 1
#endif

#define BLOCK 32
#define ROWS 8          /* rows of X run against one unpacked weight block */
#define TASK_N 16       /* output columns per parallel task */

static const OrtApi *ort;

typedef struct {
  int64_t k, n;
} Kernel;

/* ---- float16 -> float32 (F16C where there is one) ---- */
static inline float half_to_float(uint16_t h) {
#ifdef MESHD_X86
  return _cvtsh_ss(h);
#else
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal */
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000 | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
#endif
}

/* ---- activations: int8 codes per block, in nibble order ---- */
typedef struct {
  int8_t *q;     /* [M, K] */
  float *step;   /* [M, K/32] */
  float *sum;    /* [M, K/32]: step * sum of the block's codes */
} Acts;

/* one block of 32 values: its codes (even values first, then odd: the nibbles' order), its
   step and step * the codes' sum; rounding to nearest even in both versions */
static inline void quantize_block(const float *v, int8_t *o, float *step, float *sum) {
#ifdef MESHD_X86
  const __m256 a0 = _mm256_loadu_ps(v), a1 = _mm256_loadu_ps(v + 8), a2 = _mm256_loadu_ps(v + 16),
               a3 = _mm256_loadu_ps(v + 24), sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a0), _mm256_andnot_ps(sign, a1)),
                           _mm256_max_ps(_mm256_andnot_ps(sign, a2), _mm256_andnot_ps(sign, a3)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float d = _mm_cvtss_f32(h) / 127.f;
  const __m256 inv = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(a0, inv)),
                i1 = _mm256_cvtps_epi32(_mm256_mul_ps(a1, inv)),
                i2 = _mm256_cvtps_epi32(_mm256_mul_ps(a2, inv)),
                i3 = _mm256_cvtps_epi32(_mm256_mul_ps(a3, inv));
  __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
  t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
  /* packing works within 128-bit lanes: restore the values' order, then put each lane's even
     bytes before its odd ones and the lanes' even halves before their odd halves */
  __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  q = _mm256_shuffle_epi8(q, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                              0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  q = _mm256_permute4x64_epi64(q, 0xD8);
  _mm256_storeu_si256((__m256i *)o, q);
  *step = d;
  *sum = d * (float)_mm_cvtsi128_si32(t4);
#else
  float amax = 0.f;
  for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(v[i]));
  const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
  int s = 0;
  for (int i = 0; i < BLOCK / 2; i++) {
    int lo = (int)nearbyintf(v[2 * i] * inv), hi = (int)nearbyintf(v[2 * i + 1] * inv);
    o[i] = (int8_t)lo;
    o[BLOCK / 2 + i] = (int8_t)hi;
    s += lo + hi;
  }
  *step = d;
  *sum = d * (float)s;
#endif
}

static void quantize_row(const float *x, int64_t k, int8_t *q, float *step, float *sum) {
  for (int64_t b = 0; b < k / BLOCK; b++)
    quantize_block(x + b * BLOCK, q + b * BLOCK, step + b, sum + b);
}

/* ---- one block's integer dot product ---- */
#ifdef MESHD_X86
static inline __m256i unpack_block(const uint8_t *qs) {
  __m128i v = _mm_loadu_si128((const __m128i *)qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

static inline __m256i dot_u8s8(__m256i w, __m256i a) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, a);
#else /* codes <= 15 and |a| <= 127: the 16-bit pair sums cannot saturate */
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
#endif
}

static inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
#endif

typedef struct {
  const Kernel *kern;
  int64_t m;
  const Acts *acts;
  const uint8_t *q;
  const uint16_t *scales, *mins;
  float *y;
} Job;

/* sum over the blocks of min[b] * (step * sum of codes)[b]: the minimums' term of one output */
static inline float mins_term(const uint16_t *mn, const float *sums, int64_t nb) {
  float t = 0.f;
  int64_t b = 0;
#ifdef MESHD_X86
  __m256 acc = _mm256_setzero_ps();
  for (; b + 8 <= nb; b += 8)
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + b))),
                          _mm256_loadu_ps(sums + b), acc);
  t = hsum(acc);
#endif
  for (; b < nb; b++) t += half_to_float(mn[b]) * sums[b];
  return t;
}

/* outputs [r0, r0 + rows) of column c (inlined for each count of rows, so that the
   accumulators stay in registers): each weight block is unpacked once for all the rows */
static inline __attribute__((always_inline)) void tile(const Job *job, int64_t c, int64_t r0,
                                                       const int rows) {
  const int64_t k = job->kern->k, n = job->kern->n, nb = k / BLOCK;
  const Acts *a = job->acts;
  const uint8_t *qs = job->q + c * nb * (BLOCK / 2);
  const uint16_t *sc = job->scales + c * nb;
#ifdef MESHD_X86
  __m256 acc[ROWS];
  for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const __m256i w = unpack_block(qs + b * (BLOCK / 2));
    const float s = half_to_float(sc[b]);
    for (int r = 0; r < rows; r++) {
      const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + (r0 + r) * k + b * BLOCK));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(w, x)),
                               _mm256_set1_ps(s * a->step[(r0 + r) * nb + b]), acc[r]);
    }
  }
  for (int r = 0; r < rows; r++)
    job->y[(r0 + r) * n + c] =
        hsum(acc[r]) + mins_term(job->mins + c * nb, a->sum + (r0 + r) * nb, nb);
#else
  float acc[ROWS] = {0};
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *blk = qs + b * (BLOCK / 2);
    const float s = half_to_float(sc[b]);
    for (int r = 0; r < rows; r++) {
      const int8_t *x = a->q + (r0 + r) * k + b * BLOCK;
      int32_t dot = 0;
      for (int i = 0; i < BLOCK / 2; i++)
        dot += (blk[i] & 0x0F) * x[i] + (blk[i] >> 4) * x[BLOCK / 2 + i];
      acc[r] += s * a->step[(r0 + r) * nb + b] * (float)dot;
    }
  }
  for (int r = 0; r < rows; r++)
    job->y[(r0 + r) * n + c] =
        acc[r] + mins_term(job->mins + c * nb, a->sum + (r0 + r) * nb, nb);
#endif
}

/* output columns [n0, n1) for rows [r0, r0 + rows) of X */
static void columns(const Job *job, int64_t n0, int64_t n1, int64_t r0, int rows) {
  for (int64_t c = n0; c < n1; c++) {
    switch (rows) {
      case 1: tile(job, c, r0, 1); break;
      case 2: tile(job, c, r0, 2); break;
      case 3: tile(job, c, r0, 3); break;
      case 4: tile(job, c, r0, 4); break;
      case 5: tile(job, c, r0, 5); break;
      case 6: tile(job, c, r0, 6); break;
      case 7: tile(job, c, r0, 7); break;
      default: tile(job, c, r0, 8); break;
    }
  }
}

static void task(void *data, size_t i) {
  const Job *job = (const Job *)data;
  int64_t n0 = (int64_t)i * TASK_N, n1 = n0 + TASK_N;
  if (n1 > job->kern->n) n1 = job->kern->n;
  for (int64_t r0 = 0; r0 < job->m; r0 += ROWS) {
    columns(job, n0, n1, r0, job->m - r0 < ROWS ? (int)(job->m - r0) : ROWS);
  }
}

typedef struct {
  const float *x;
  int64_t k;
  Acts *acts;
} QuantJob;

static void quant_task(void *data, size_t row) {
  const QuantJob *j = (const QuantJob *)data;
  int64_t nb = j->k / BLOCK;
  quantize_row(j->x + (int64_t)row * j->k, j->k, j->acts->q + (int64_t)row * j->k,
               j->acts->step + (int64_t)row * nb, j->acts->sum + (int64_t)row * nb);
}

/* ---- onnxruntime glue ---- */
#define TRY(expr)                  \
  do {                             \
    status = (expr);               \
    if (status) goto done;         \
  } while (0)

static OrtStatus *fail(const char *msg) { return ort->CreateStatus(ORT_INVALID_ARGUMENT, msg); }

static OrtStatus *compute(void *op_kernel, OrtKernelContext *ctx) {
  const Kernel *kern = (const Kernel *)op_kernel;
  OrtStatus *status = NULL;
  const OrtValue *in[4];
  OrtTensorTypeAndShapeInfo *info = NULL;
  int64_t dims[8];
  size_t rank = 0;
  Acts acts = {0};
  for (size_t i = 0; i < 4; i++) TRY(ort->KernelContext_GetInput(ctx, i, &in[i]));
  TRY(ort->GetTensorTypeAndShape(in[0], &info));
  TRY(ort->GetDimensionsCount(info, &rank));
  if (rank < 1 || rank > 8) TRY(fail("MatMulQ4: X must have 1 to 8 dimensions"));
  TRY(ort->GetDimensions(info, dims, rank));
  if (dims[rank - 1] != kern->k) TRY(fail("MatMulQ4: X's last dimension is not K"));
  int64_t m = 1;
  for (size_t i = 0; i + 1 < rank; i++) m *= dims[i];
  dims[rank - 1] = kern->n;
  OrtValue *out = NULL;
  TRY(ort->KernelContext_GetOutput(ctx, 0, dims, rank, &out));
  void *xp, *qp, *sp, *mp, *yp;
  TRY(ort->GetTensorMutableData((OrtValue *)in[0], &xp));
  TRY(ort->GetTensorMutableData((OrtValue *)in[1], &qp));
  TRY(ort->GetTensorMutableData((OrtValue *)in[2], &sp));
  TRY(ort->GetTensorMutableData((OrtValue *)in[3], &mp));
  TRY(ort->GetTensorMutableData(out, &yp));
  if (m == 0) goto done;
  int64_t nb = kern->k / BLOCK;
  acts.q = (int8_t *)malloc((size_t)(m * kern->k));
  acts.step = (float *)malloc(sizeof(float) * (size_t)(m * nb));
  acts.sum = (float *)malloc(sizeof(float) * (size_t)(m * nb));
  if (!acts.q || !acts.step || !acts.sum) TRY(ort->CreateStatus(ORT_FAIL, "MatMulQ4: out of memory"));
  QuantJob qj = {(const float *)xp, kern->k, &acts};
  if (m == 1) {
    quant_task(&qj, 0);
  } else {
    TRY(ort->KernelContext_ParallelFor(ctx, quant_task, (size_t)m, 0, &qj));
  }
  Job job = {kern, m, &acts, (const uint8_t *)qp, (const uint16_t *)sp, (const uint16_t *)mp,
             (float *)yp};
  TRY(ort->KernelContext_ParallelFor(ctx, task, (size_t)((kern->n + TASK_N - 1) / TASK_N), 0,
                                     &job));
done:
  if (info) ort->ReleaseTensorTypeAndShapeInfo(info);
  free(acts.q);
  free(acts.step);
  free(acts.sum);
  return status;
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                void **out) {
  (void)op;
  (void)api;
  Kernel *k = (Kernel *)calloc(1, sizeof(Kernel));
  if (!k) return ort->CreateStatus(ORT_FAIL, "MatMulQ4: out of memory");
  OrtStatus *st = ort->KernelInfoGetAttribute_int64(info, "K", &k->k);
  if (!st) st = ort->KernelInfoGetAttribute_int64(info, "N", &k->n);
  if (!st && (k->k <= 0 || k->k % BLOCK || k->n <= 0))
    st = fail("MatMulQ4: K must be a positive multiple of 32 and N positive");
  if (st) {
    free(k);
    return st;
  }
  *out = k;
  return NULL;
}

static void destroy_kernel(void *k) { free(k); }
static const char *op_name(const OrtCustomOp *op) { (void)op; return "MatMulQ4"; }
static const char *op_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static ONNXTensorElementDataType input_type(const OrtCustomOp *op, size_t i) {
  (void)op;
  return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
         : i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8
                  : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
}
static size_t input_count(const OrtCustomOp *op) { (void)op; return 4; }
static ONNXTensorElementDataType output_type(const OrtCustomOp *op, size_t i) {
  (void)op; (void)i;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t output_count(const OrtCustomOp *op) { (void)op; return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) {
  (void)op; (void)i;
  return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType mem_default(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }
static int one(const OrtCustomOp *op) { (void)op; return 1; }
static int zero(const OrtCustomOp *op) { (void)op; return 0; }
static int start_version(const OrtCustomOp *op) { (void)op; return 1; }
static int end_version(const OrtCustomOp *op) { (void)op; return 2147483647; }

static OrtCustomOp matmul_q4;
static OrtCustomOpDomain *domain;

/* A string naming the vector path compiled in (meshd.engine.q4kernel logs it). */
const char *meshd_q4_path(void) {
#if defined(MESHD_X86) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx512vnni";
#elif defined(MESHD_X86) && defined(__AVXVNNI__)
  return "avxvnni";
#elif defined(MESHD_X86)
  return "avx2";
#else
  return "c";
#endif
}

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  if (!ort) {
    ort = base->GetApi(ORT_API_VERSION);
    if (!ort) return NULL; /* an onnxruntime older than the header: cannot happen via meshd */
  }
  if (!domain) {
    memset(&matmul_q4, 0, sizeof matmul_q4);
    matmul_q4.version = ORT_API_VERSION;
    matmul_q4.CreateKernelV2 = create_kernel;
    matmul_q4.GetName = op_name;
    matmul_q4.GetExecutionProviderType = op_provider;
    matmul_q4.GetInputType = input_type;
    matmul_q4.GetInputTypeCount = input_count;
    matmul_q4.GetOutputType = output_type;
    matmul_q4.GetOutputTypeCount = output_count;
    matmul_q4.KernelComputeV2 = compute;
    matmul_q4.KernelDestroy = destroy_kernel;
    matmul_q4.GetInputCharacteristic = required;
    matmul_q4.GetOutputCharacteristic = required;
    matmul_q4.GetInputMemoryType = mem_default;
    matmul_q4.GetVariadicInputMinArity = one;
    matmul_q4.GetVariadicInputHomogeneity = zero;
    matmul_q4.GetVariadicOutputMinArity = one;
    matmul_q4.GetVariadicOutputHomogeneity = zero;
    matmul_q4.GetStartVersion = start_version;
    matmul_q4.GetEndVersion = end_version;
    OrtStatus *st = ort->CreateCustomOpDomain("meshd", &domain);
    if (st) return st;
    st = ort->CustomOpDomain_Add(domain, &matmul_q4);
    if (st) return st;
  }
  return ort->AddCustomOpDomain(options, domain);
}
