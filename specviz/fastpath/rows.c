/* y[M, N] = x[M, K] · Wᵀ in fp32 for a weight packed as [N / 16][K][16] (see specviz/fastpath/rows.py).
 *
 * Decode multiplies a few rows by every matrix, so the time is the time to read the weights once. Each
 * block of 16 output columns is K × 16 consecutive floats: the loop reads it front to back while up to
 * six rows keep their sixteen sums in registers (12 of the 16 AVX2 vector registers), so the weights are
 * read once per six rows and the hardware prefetcher sees one straight stream per thread.
 *
 * Each output is a single running sum over k in order, the same arithmetic whatever M and whatever the
 * thread count: a row multiplied among 80 gets the bits it gets alone (a verify's logits equal decode's).
 * Written with GCC/Clang vector types, not intrinsics: one source for AVX2, AVX-512 and NEON. */
#include <math.h>
#include <stddef.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8 v) { __builtin_memcpy(p, &v, sizeof v); }

/* One row's step: its input value times the block's 16 weights of this k, added to its two sums. */
#define STEP(i) if (MR > i) { float s = x[i * ldx + k]; a##i += s * w0; b##i += s * w1; }
#define SAVE(i) if (MR > i) { store8(y + i * ldy, a##i); store8(y + i * ldy + 8, b##i); }

/* MR rows (a compile-time constant, so the unused sums vanish) times one 16-column block. */
#define KERNEL(MR_)                                                                                   \
static __attribute__((unused)) void rows##MR_(const float *restrict x, long ldx, const float *restrict w, long K, \
                      float *restrict y, long ldy, const float *pf) {                                 \
    enum { MR = MR_ };                                                                                \
    v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0};                                    \
    v8 b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0}, b4 = {0}, b5 = {0};                                    \
    for (long k = 0; k < K; k++) {                                                                    \
        if (pf) __builtin_prefetch(pf + 16 * k, 0, 0);                                                \
        v8 w0 = load8(w + 16 * k), w1 = load8(w + 16 * k + 8);                                        \
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5)                                               \
    }                                                                                                 \
    SAVE(0) SAVE(1) SAVE(2) SAVE(3) SAVE(4) SAVE(5)                                                   \
}
KERNEL(1) KERNEL(2) KERNEL(3) KERNEL(4) KERNEL(5) KERNEL(6)

/* Both kernels' first group of rows prefetches PREFETCH_K steps (PREFETCH_K × 64 bytes) ahead of its loads.
 * Why 96 steps (6 KB): one core keeps a stream at memory speed only with ~100 ns of lines in flight, and
 * the hardware prefetcher alone, or 16 steps (1 KB), is a third of that. Packed blocks lie end to end, so
 * a prefetch past a block's end fetches the next block's start. */
#define PREFETCH_K 96

/* A kernel: MR rows (its name says how many) times one block, or two; the last argument is where to
 * prefetch. */
typedef void (*kernel_fn)(const float *restrict, long, const float *restrict, long, float *restrict, long,
                          const float *);

#if defined(__AVX512F__) && defined(SPECVIZ_WIDE)
/* AVX-512 variant (built where the CPU has AVX-512 unless SPECVIZ_KERNEL_WIDE=0, see rows.py; faster than
 * the 256-bit kernel from a few rows on, level at one row). A block's 16 columns are one 64-byte load and one register
 * per row, so eight rows' sums fit (8 of the 32 registers) and the weights are read once per eight
 * rows; a software prefetch runs PREFETCH_K steps (PREFETCH_K × 64 bytes) ahead of the loads. Each
 * output is still one running sum over k in order: the same bits as the 256-bit kernel above. */
typedef float v16 __attribute__((vector_size(64)));

static inline v16 load16(const float *p) { v16 v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, v16 v) { __builtin_memcpy(p, &v, sizeof v); }

#define WSTEP(i) if (MR > i) { a##i += x[i * ldx + k] * wk; }
#define WSAVE(i) if (MR > i) store16(y + i * ldy, a##i);
#define WKERNEL(MR_)                                                                                  \
static void wide##MR_(const float *restrict x, long ldx, const float *restrict w, long K,            \
                      float *restrict y, long ldy, const float *pf) {                                 \
    enum { MR = MR_ };                                                                                \
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};               \
    v16 a8 = {0}, a9 = {0};                                                                           \
    for (long k = 0; k < K; k++) {                                                                    \
        __builtin_prefetch(pf + 16 * k, 0, 0);                                                        \
        v16 wk = load16(w + 16 * k);                                                                  \
        WSTEP(0) WSTEP(1) WSTEP(2) WSTEP(3) WSTEP(4) WSTEP(5) WSTEP(6) WSTEP(7)                       \
        WSTEP(8) WSTEP(9)                                                                             \
    }                                                                                                 \
    WSAVE(0) WSAVE(1) WSAVE(2) WSAVE(3) WSAVE(4) WSAVE(5) WSAVE(6) WSAVE(7)                           \
    WSAVE(8) WSAVE(9)                                                                                 \
}
WKERNEL(1) WKERNEL(2) WKERNEL(3) WKERNEL(4) WKERNEL(5) WKERNEL(6) WKERNEL(7) WKERNEL(8)
WKERNEL(9) WKERNEL(10)

/* Two neighbouring blocks (32 columns) for up to eight rows: 16 sums in registers and two weight loads
 * per 16 multiply-adds, where the one-block kernel needs a load (and a broadcast) per multiply-add. Used
 * from PAIR_ROWS rows on, where the product is bound by arithmetic, not by memory; at 2-8 rows
 * (memory-bound) two streams read slower than one, so those stay on one block. Each output is still one
 * running sum over k in order: the same bits. */
#define PSTEP(i) if (MR > i) { float s = x[i * ldx + k]; a##i += s * w0; c##i += s * w1; }
#define PSAVE(i) if (MR > i) { store16(y + i * ldy, a##i); store16(y + i * ldy + 16, c##i); }
#define PKERNEL(MR_)                                                                                  \
static void pair##MR_(const float *restrict x, long ldx, const float *restrict w, long K,            \
                      float *restrict y, long ldy, const float *pf) {                                 \
    enum { MR = MR_ };                                                                                \
    const float *restrict u = w + 16 * K;                                                             \
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};               \
    v16 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, c4 = {0}, c5 = {0}, c6 = {0}, c7 = {0};               \
    for (long k = 0; k < K; k++) {                                                                    \
        __builtin_prefetch(pf + 16 * k, 0, 0);                                                        \
        __builtin_prefetch(pf + 16 * (K + k), 0, 0);                                                  \
        v16 w0 = load16(w + 16 * k), w1 = load16(u + 16 * k);                                         \
        PSTEP(0) PSTEP(1) PSTEP(2) PSTEP(3) PSTEP(4) PSTEP(5) PSTEP(6) PSTEP(7)                       \
    }                                                                                                 \
    PSAVE(0) PSAVE(1) PSAVE(2) PSAVE(3) PSAVE(4) PSAVE(5) PSAVE(6) PSAVE(7)                           \
}
PKERNEL(1) PKERNEL(2) PKERNEL(3) PKERNEL(4) PKERNEL(5) PKERNEL(6) PKERNEL(7) PKERNEL(8)

static const kernel_fn WIDE[11] = {0, wide1, wide2, wide3, wide4, wide5, wide6, wide7, wide8, wide9, wide10};
static const kernel_fn PAIR[9] = {0, pair1, pair2, pair3, pair4, pair5, pair6, pair7, pair8};
#define GROUP 8          /* rows whose sums one kernel call keeps in registers */
/* 9 or 10 rows (a verify of 8 or 9 drafts at one row) run as one group of that many (10 of the 32
 * registers): split 8 + 1 or 8 + 2, the second group reads the block again for its one or two rows, and
 * 9 rows cost about what 16 do. One group of 11 is load-bound (a broadcast per row per k) and no faster,
 * so 11 stays 8 + 3. */
#define WIDE_ROWS 10
#define PAIR_ROWS 12     /* from here on two blocks at a time (at 9-11 rows, measured no faster) */

/* nb (1 or 2) blocks times all M rows, GROUP rows at a time. The first group streams the weights,
 * prefetching PREFETCH_K steps ahead; the second works from cache and fetches the `next` span meanwhile
 * (NULL: there is none), so that span's first group finds it in cache; later groups prefetch
 * what they read (lines already there). One row or a few: one group, a stream at memory speed. */
static void span(const float *x, long M, long K, const float *w, long nb, float *y, long ldy,
                 const float *next) {
    if (M > GROUP && M <= WIDE_ROWS) {          /* one group: see WIDE_ROWS */
        WIDE[M](x, K, w, K, y, ldy, w + 16 * PREFETCH_K);
        return;
    }
    for (long m = 0; m < M; m += GROUP) {
        long mr = M - m < GROUP ? M - m : GROUP;
        const float *pf = m == 0 ? w + 16 * PREFETCH_K : (m == GROUP && next ? next : w);
        (nb == 2 ? PAIR : WIDE)[mr](x + m * K, K, w, K, y + m * ldy, ldy, pf);
    }
}
#define KERNEL_BITS 512
#else
#define KERNEL_BITS 256
static const kernel_fn NARROW[7] = {0, rows1, rows2, rows3, rows4, rows5, rows6};
#define GROUP 6
#define PAIR_ROWS 0      /* no two-block kernel here: 16 registers hold one block's sums for six rows */

/* One block times all M rows, six at a time. The first group streams the block from memory, prefetching
 * PREFETCH_K steps ahead; the second works from cache and fetches the `next`
 * block meanwhile (NULL: none), so the next span's first group does not wait on memory. */
static void span(const float *x, long M, long K, const float *w, long nb, float *y, long ldy,
                 const float *next) {
    (void)nb;
    for (long m = 0; m < M; m += GROUP) {
        long mr = M - m < GROUP ? M - m : GROUP;
        NARROW[mr](x + m * K, K, w, K, y + m * ldy, ldy, m == 0 ? w + 16 * PREFETCH_K : m == GROUP ? next : NULL);
    }
}
#endif

/* x: [M, K] contiguous; wp: [N / 16, K, 16]; y: [M, N] contiguous (N a multiple of 16). Threads split
 * the spans of column blocks (torch's own OpenMP runtime is the one loaded, so its threads are reused):
 * two blocks a span from PAIR_ROWS rows on (the last one alone where the count is odd), else one. */
static inline void one_span(const float *x, long M, long K, const float *wp, long blocks, long per, long s,
                            float *y, long N) {
    long b = s * per, nb = blocks - b < per ? blocks - b : per;
    const float *next = b + nb < blocks ? wp + (b + nb) * K * 16 : NULL;
    span(x, M, K, wp + b * K * 16, nb, y + b * 16, N, next);
}

void specviz_rows(const float *x, long M, long K, const float *wp, long N, float *y, int threads) {
    long blocks = N / 16, per = PAIR_ROWS && M >= PAIR_ROWS ? 2 : 1, spans = (blocks + per - 1) / per;
#ifdef _OPENMP
    if (threads > 1) {
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (long s = 0; s < spans; s++)
            one_span(x, M, K, wp, blocks, per, s, y, N);
        return;
    }
#endif
    (void)threads;          /* one thread: no parallel region at all, so no OpenMP pool for this thread */
    for (long s = 0; s < spans; s++)
        one_span(x, M, K, wp, blocks, per, s, y, N);
}

/* --- one whole decoder layer for a block of M = B × T rows -------------------------------------------
 * Why: with the weights read at memory speed, the ~25 small torch calls a layer makes besides its four
 * products (norms, rotary, cache writes, attention, SiLU, the residual adds), microseconds each on
 * vectors of a few hundred floats, are a large share of a one-token pass. Here a layer is one call.
 * Same arithmetic as specviz/fastpath/llama.py::decoder_layer (sums may round differently, ~1e-6), and
 * every row is computed on its own: its bits do not depend on the other rows. */
typedef struct {
    const float *ln1, *ln2, *wqkv, *bqkv, *wo, *bo, *wgu, *wdown;   /* weights; biases may be NULL */
    long d, H, Hkv, hd, inter;                                       /* model width, heads, head size, MLP */
    long qkv_w, o_w, gu_w, down_w;                  /* output widths (packed: rounded up to × 16) */
    float eps;
    long kinds[4];                                  /* per matrix (qkv, o, gu, down): one of the KIND_ */
} specviz_weights;

/* How a matrix is stored, and so whose product multiplies by it. Our kernel is not the fastest on every
 * CPU (some BLAS libraries stream one row faster than ours), so a C layer may hand a
 * matrix to the BLAS torch itself links — the same product F.linear runs — instead of forcing ours. */
enum { KIND_PACKED = 0,      /* [N / 16][K][16] blocks: specviz_rows */
       KIND_STOCK = 1,       /* the model's own [N, K] row-major matrix: sgemm, W transposed */
       KIND_COLMAJOR = 2 };  /* the same matrix stored [K, N]: sgemm, not transposed */

/* Fortran BLAS sgemm (column-major), found in the process at load time (rows.py, specviz_set_gemm):
 * MKL inside torch's own library on x86. NULL where there is none: such layers are then not offered. */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *,
                         const int *);
static sgemm_fn gemm = NULL;

void specviz_set_gemm(void *fn) { gemm = (sgemm_fn)fn; }
int specviz_has_gemm(void) { return gemm != NULL; }

/* y[M, N] = x[M, K] · Wᵀ. In column-major terms y is yᵀ [N × M] = W [N × K] · xᵀ [K × M]. The BLAS
 * product's sums are its own: a row's bits may depend on how many rows share the call (verify ≠ decode
 * bit for bit there; the engine's tests check that greedy output stays exact). */
static void product(const float *x, long M, long K, const float *wp, long N, float *y, int threads, long kind) {
    if (kind == KIND_PACKED || gemm == NULL) {
        specviz_rows(x, M, K, wp, N, y, threads);
        return;
    }
    const int m = (int)N, n = (int)M, k = (int)K, ldw = kind == KIND_STOCK ? (int)K : (int)N, ldx = (int)K;
    const int ldy = (int)N;
    const float one = 1.f, zero = 0.f;
    gemm(kind == KIND_STOCK ? "T" : "N", "N", &m, &n, &k, &one, wp, &ldw, x, &ldx, &zero, y, &ldy);
}

/* Which vector code path this build took (the kernels command prints it): the instruction set
 * -march=native enabled, and the width of the product kernel's vectors. */
const char *specviz_isa(void) {
#if defined(__AVX512F__) && KERNEL_BITS == 512
    return "avx512 (512-bit kernel)";
#elif defined(__AVX512F__)
    return "avx512 (256-bit kernel)";
#elif defined(__AVX2__)
    return "avx2";
#elif defined(__ARM_NEON)
    return "neon";
#else
    return "generic";
#endif
}

/* e^x in a form the compiler vectorises (glibc's expf is a call per value, and SiLU and the softmax need
 * one per element). Range reduction x = n·ln2 + r, then Cephes' degree-6 polynomial for
 * e^r, then 2^n through the exponent bits; within ~2 ulp of expf. Every multiply-add is an explicit fmaf,
 * so a value gets the same bits in the vector loop and in its scalar tail. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float y = __builtin_fmaf(x, 1.44269504088896341f, 0.5f);
    int k = (int)y;
    k -= (float)k > y;                                  /* floor(y), in a form that vectorises */
    float n = (float)k;
    float r = __builtin_fmaf(n, -0.693359375f, x);
    r = __builtin_fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = __builtin_fmaf(p, r, 1.3981999507e-3f);
    p = __builtin_fmaf(p, r, 8.3334519073e-3f);
    p = __builtin_fmaf(p, r, 4.1665795894e-2f);
    p = __builtin_fmaf(p, r, 1.6666665459e-1f);
    p = __builtin_fmaf(p, r, 5.0000001201e-1f);
    p = __builtin_fmaf(p, r * r, r) + 1.0f;
    union { int i; float f; } scale = { (k + 127) << 23 };        /* 2^n */
    return p * scale.f;
}

/* a · b with eight running sums, added up in a fixed order: the same bits for a row wherever it is. */
static inline float dot(const float *a, const float *b, long n) {
    v8 acc = {0};
    long i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void norm_rows(const float *x, long M, long d, const float *g, float eps, float *out) {
    for (long r = 0; r < M; r++) {
        const float *xr = x + r * d;
        float ss = dot(xr, xr, d);
        float inv = 1.f / sqrtf(ss / (float)d + eps);
        for (long i = 0; i < d; i++) out[r * d + i] = g[i] * (xr[i] * inv);
    }
}

/* RoPE, rotate-half convention, the sign carried by sin (see CompactLlama.rope): v·cos + swap(v)·sin. */
static void rotate_head(float *v, const float *c, const float *s, long hd) {
    long half = hd / 2;
    float tmp[hd];
    for (long i = 0; i < hd; i++) tmp[i] = v[i] * c[i] + v[i < half ? i + half : i - half] * s[i];
    memcpy(v, tmp, sizeof(float) * hd);
}

/* Softmax attention of one query row over S slots of one KV head (additive mask `bias`). */
static void attend_row(const float *q, const float *k, const float *v, long ks, const float *bias, long S,
                       long hd, float scale, float *out) {
    float sc[S];
    float mx = -INFINITY;
    for (long s = 0; s < S; s++) {
        sc[s] = dot(q, k + s * ks, hd) * scale + bias[s];
        if (sc[s] > mx) mx = sc[s];
    }
    float sum = 0.f;
    for (long s = 0; s < S; s++) sc[s] = fast_exp(sc[s] - mx);
    /* slot s always lands in lane s % 8 and the lanes are added in one order, so the masked slots a
     * longer block appends (exact zeros) leave the sum's bits as they are: verify = decode */
    v8 lanes = {0};
    long s8 = 0;
    for (; s8 + 8 <= S; s8 += 8) lanes += load8(sc + s8);
    float tail[8] = {0};
    for (long s = s8; s < S; s++) tail[s - s8] = sc[s];
    lanes += load8(tail);
    sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (long i = 0; i < hd; i++) out[i] = 0.f;
    for (long s = 0; s < S; s++) {
        const float *vs = v + s * ks;
        float p = sc[s];
        for (long i = 0; i < hd; i++) out[i] += p * vs[i];
    }
    for (long i = 0; i < hd; i++) out[i] /= sum;
}

/* x: [M, d] residual stream of the block's M tokens, updated in place: all B × T of a [B, T] block
 * (sel NULL), or only its real ones, token r at flat position sel[r] = b·T + t (a verify with holes:
 * the holes cost nothing and their cache slots are not written; they stay invalid). cos, sin: [M, hd];
 * bias: [B, T, S]; kbuf, vbuf: [B, Hkv, ≥ S, hd] with strides (kb, kh, ks) in floats, token (b, t)
 * written at slot slot0 + t; scratch: specviz_layer_scratch(M, w) floats. */
void specviz_layer(float *x, long M, long T, const long *sel, const specviz_weights *w, const float *cos_,
                   const float *sin_, const float *bias, float *kbuf, float *vbuf, long kb, long kh, long ks,
                   long S, long slot0, float scale, float *scratch, int threads) {
    long d = w->d, H = w->H, Hkv = w->Hkv, hd = w->hd, I = w->inter, g = H / Hkv;
    float *h = scratch, *qkv = h + M * d, *att = qkv + M * w->qkv_w, *o = att + M * H * hd;
    float *gu = o + M * (w->o_w > w->down_w ? w->o_w : w->down_w), *act = gu + M * w->gu_w;
    norm_rows(x, M, d, w->ln1, w->eps, h);
    product(h, M, d, w->wqkv, w->qkv_w, qkv, threads, w->kinds[0]);
    for (long r = 0; r < M; r++) {
        float *row = qkv + r * w->qkv_w;
        long flat = sel ? sel[r] : r, b = flat / T, t = flat % T;
        if (w->bqkv) for (long i = 0; i < (H + 2 * Hkv) * hd; i++) row[i] += w->bqkv[i];
        for (long j = 0; j < H + Hkv; j++) rotate_head(row + j * hd, cos_ + r * hd, sin_ + r * hd, hd);
        for (long j = 0; j < Hkv; j++) {
            long at = b * kb + j * kh + (slot0 + t) * ks;
            memcpy(kbuf + at, row + (H + j) * hd, sizeof(float) * hd);
            memcpy(vbuf + at, row + (H + Hkv + j) * hd, sizeof(float) * hd);
        }
    }
    #pragma omp parallel for num_threads(threads > 1 ? threads : 1) schedule(static) if (threads > 1 && M * H > 1)
    for (long task = 0; task < M * H; task++) {
        long r = task / H, head = task % H, flat = sel ? sel[r] : r, b = flat / T, j = head / g;
        attend_row(qkv + r * w->qkv_w + head * hd, kbuf + b * kb + j * kh, vbuf + b * kb + j * kh, ks,
                   bias + flat * S, S, hd, scale, att + r * H * hd + head * hd);
    }
    product(att, M, H * hd, w->wo, w->o_w, o, threads, w->kinds[1]);
    for (long r = 0; r < M; r++)
        for (long i = 0; i < d; i++) x[r * d + i] += w->bo ? o[r * w->o_w + i] + w->bo[i] : o[r * w->o_w + i];
    norm_rows(x, M, d, w->ln2, w->eps, h);
    product(h, M, d, w->wgu, w->gu_w, gu, threads, w->kinds[2]);
    #pragma omp parallel for num_threads(threads > 1 ? threads : 1) schedule(static) if (threads > 1 && M > 1)
    for (long r = 0; r < M; r++)
        for (long i = 0; i < I; i++) {
            float a = gu[r * w->gu_w + i];
            act[r * I + i] = a / (1.f + fast_exp(-a)) * gu[r * w->gu_w + I + i];
        }
    product(act, M, I, w->wdown, w->down_w, o, threads, w->kinds[3]);
    for (long r = 0; r < M; r++)
        for (long i = 0; i < d; i++) x[r * d + i] += o[r * w->down_w + i];
}

/* The binding (rows.py, _Weights) mirrors specviz_weights field by field; it refuses a library whose
 * struct has another size (a source edited on one side only), rather than read fields at wrong offsets. */
long specviz_weights_size(void) {
    return (long)sizeof(specviz_weights);
}

long specviz_layer_scratch(long M, const specviz_weights *w) {
    long o = w->o_w > w->down_w ? w->o_w : w->down_w;
    return M * (w->d + w->qkv_w + w->H * w->hd + o + w->gu_w + w->inter);
}
