// Symmetric eigendecomposition, SVD and LU on the host CPU, for XLA:CPU programs (custom calls).
//
// StableHLO has no eigensolver, so the portable lowerings (lowering/eigh.py, svd.py) run
// parallel Jacobi sweeps built from gathers and elementwise ops: right for a TPU, but on
// XLA:CPU each of a sweep's n - 1 steps is a pass over the whole matrix, ~10 s for a
// 512 x 512 eigh against ~10 ms in LAPACK (LU: one column per while-loop step, 220 ms at 512).
// On the CPU-emulated device these handlers run the LAPACK drivers PyTorch's CPU kernels call:
//
//   torchtpu_eigh_v1(a: T[B, n, n] symmetric, upper: s32[]) -> (w: T[B, n] ascending, v: T[B, n, n])
//   torchtpu_svd_v1(a: T[B, m, n]) -> s: T[B, k]                        (k = min(m, n))
//                                  -> (u: T[B, m, j], s: T[B, k], vh: T[B, j, n])   j = k or m|n
//   torchtpu_lu_v1(a: T[B, m, n]) -> (lu: T[B, m, n], perm: s64[B, m], pivots: s32[B, k])
//   torchtpu_geqrf_v1(a: T[B, m, n]) -> (packed: T[B, m, n], tau: T[B, k])
//   torchtpu_orgqr_v1(packed: T[B, m, n], tau: T[B, t]) -> q: T[B, m, c]      t <= c <= m
//   torchtpu_cholesky_v1(a: T[B, n, n]) -> (l: T[B, n, n], info: s32[B])
//
// (lu: getrf's packed factors of a itself, row-major; pivots: its 1-based row swaps; perm: the
// row order they make, a[perm] = L U. geqrf: R and the Householder reflectors packed, and
// their scales; orgqr: the first c columns of the reflectors' product, as linalg.qr and
// householder_product use them. cholesky: potrf's lower factor from a's lower triangle, its
// strict upper triangle zero, and potrf's info: the order of the first leading minor that is
// not positive definite, 0 if none.)
//
// T is f32 or f64. `upper` names the triangle LAPACK reads (the lowering mirrors the one the
// user named, so both hold the matrix; LAPACK's eigenvectors' signs depend on which it reads,
// and PyTorch's CPU eigh reads the one named). The svd's result shapes say what to compute: only s, the reduced
// factors (j = k) or the full ones (u m x m, vh n x n). A decomposition that LAPACK reports
// as failed comes back as NaN, as a diverging Jacobi sweep would.
//
// LAPACK itself is not linked: the library that provides it (PyTorch's, in torchtpu) hands
// its {s,d}syevd_, gesdd_, getrf_, geqrf_, orgqr_ and potrf_ (Fortran ABI, 32-bit integers) to
// torchtpu_set_lapack before the handlers are registered. No PyTorch here.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_ffi.h"

namespace {

using namespace torchtpu_cpu;  // NOLINT: the FFI layouts (cpu_ffi.h)

template <typename T>
using Syevd = void (*)(const char* jobz, const char* uplo, const int* n, T* a, const int* lda, T* w, T* work,
                       const int* lwork, int* iwork, const int* liwork, int* info);
template <typename T>
using Getrf = void (*)(const int* m, const int* n, T* a, const int* lda, int* ipiv, int* info);
template <typename T>
using Geqrf = void (*)(const int* m, const int* n, T* a, const int* lda, T* tau, T* work, const int* lwork, int* info);
template <typename T>
using Orgqr = void (*)(const int* m, const int* n, const int* k, T* a, const int* lda, const T* tau, T* work,
                       const int* lwork, int* info);
template <typename T>
using Potrf = void (*)(const char* uplo, const int* n, T* a, const int* lda, int* info);
template <typename T>
using Gesdd = void (*)(const char* jobz, const int* m, const int* n, T* a, const int* lda, T* s, T* u,
                       const int* ldu, T* vt, const int* ldvt, T* work, const int* lwork, int* iwork, int* info);

// One precision's drivers, in the order torchtpu_set_lapack receives them.
template <typename T>
struct Drivers {
  static constexpr int kCount = 6;
  Syevd<T> syevd = nullptr;
  Gesdd<T> gesdd = nullptr;
  Getrf<T> getrf = nullptr;
  Geqrf<T> geqrf = nullptr;
  Orgqr<T> orgqr = nullptr;
  Potrf<T> potrf = nullptr;

  void Set(void* const* p) {
    syevd = reinterpret_cast<Syevd<T>>(p[0]);
    gesdd = reinterpret_cast<Gesdd<T>>(p[1]);
    getrf = reinterpret_cast<Getrf<T>>(p[2]);
    geqrf = reinterpret_cast<Geqrf<T>>(p[3]);
    orgqr = reinterpret_cast<Orgqr<T>>(p[4]);
    potrf = reinterpret_cast<Potrf<T>>(p[5]);
  }
  bool Complete() const { return syevd && gesdd && getrf && geqrf && orgqr && potrf; }
};
Drivers<float> g_float;    // LAPACK's s... drivers
Drivers<double> g_double;  // and its d... drivers

template <typename T>
const Drivers<T>& lapack() {
  if constexpr (std::is_same_v<T, float>) return g_float; else return g_double;
}

template <typename T>
void FillNaN(T* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i) data[i] = std::numeric_limits<T>::quiet_NaN();
}

const FfiBuffer* Buf(const FfiList& list, int64_t i) { return static_cast<const FfiBuffer*>(list.items[i]); }

// Batch count and the last two dims of a buffer of rank >= 2.
void Dims(const FfiBuffer* x, int64_t* batch, int64_t* rows, int64_t* cols) {
  *batch = 1;
  for (int64_t d = 0; d < x->rank - 2; ++d) *batch *= x->dims[d];
  *rows = x->dims[x->rank - 2];
  *cols = x->dims[x->rank - 1];
}

// Row-major src (rows x cols) into column-major dst, or back: dst[i + j * rows] = src[i * cols + j].
template <typename T>
void ToColumnMajor(const T* src, T* dst, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i + j * rows] = src[i * cols + j];
}
template <typename T>
void FromColumnMajor(const T* src, T* dst, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[i + j * rows];
}

template <typename T>
void Eigh(const T* a, T* w, T* v, int64_t batch, int n, const char* uplo) {
  // The matrix is symmetric, so row-major is column-major; LAPACK overwrites it with the
  // eigenvectors as columns, which land in v transposed.
  std::vector<T> z(static_cast<size_t>(n) * n);
  int lwork = -1, liwork = -1, info = 0;
  T work_size = 0;
  int iwork_size = 0;
  lapack<T>().syevd("V", uplo, &n, z.data(), &n, w, &work_size, &lwork, &iwork_size, &liwork, &info);
  lwork = static_cast<int>(work_size);
  liwork = iwork_size;
  std::vector<T> work(std::max(lwork, 1));
  std::vector<int> iwork(std::max(liwork, 1));
  const int64_t nn = static_cast<int64_t>(n) * n;
  for (int64_t b = 0; b < batch; ++b) {
    std::memcpy(z.data(), a + b * nn, sizeof(T) * nn);
    lapack<T>().syevd("V", uplo, &n, z.data(), &n, w + b * n, work.data(), &lwork, iwork.data(), &liwork, &info);
    if (info != 0) {
      FillNaN(w + b * n, n);
      FillNaN(v + b * nn, nn);
      continue;
    }
    FromColumnMajor(z.data(), v + b * nn, n, n);
  }
}

// LAPACK factors the column-major copy of a, as PyTorch's CPU svd does (factoring a^T, which
// needs no copy, would flip the signs of some singular vector pairs against it).
template <typename T>
void Svd(const T* a, T* u, T* s, T* vh, int64_t batch, int m, int n, char jobz) {
  const int k = std::min(m, n);
  const int ucols = jobz == 'A' ? m : k, vrows = jobz == 'A' ? n : k;
  const int lda = std::max(m, 1), ldu = std::max(m, 1), ldvt = std::max(vrows, 1);
  std::vector<T> x(static_cast<size_t>(m) * n);
  std::vector<T> lu(jobz == 'N' ? 1 : static_cast<size_t>(m) * ucols);
  std::vector<T> lvt(jobz == 'N' ? 1 : static_cast<size_t>(vrows) * n);
  std::vector<int> iwork(8 * std::max(k, 1));
  int lwork = -1, info = 0;
  T work_size = 0;
  lapack<T>().gesdd(&jobz, &m, &n, x.data(), &lda, s, lu.data(), &ldu, lvt.data(), &ldvt, &work_size, &lwork,
                    iwork.data(), &info);
  lwork = std::max(static_cast<int>(work_size), 1);
  std::vector<T> work(lwork);
  const int64_t mn = static_cast<int64_t>(m) * n;
  const int64_t u_size = static_cast<int64_t>(m) * ucols, vh_size = static_cast<int64_t>(vrows) * n;
  for (int64_t b = 0; b < batch; ++b) {
    ToColumnMajor(a + b * mn, x.data(), m, n);  // gesdd overwrites its input
    lapack<T>().gesdd(&jobz, &m, &n, x.data(), &lda, s + b * k, lu.data(), &ldu, lvt.data(), &ldvt, work.data(),
                      &lwork, iwork.data(), &info);
    if (info != 0) {
      FillNaN(s + b * k, k);
      if (jobz != 'N') {
        FillNaN(u + b * u_size, u_size);
        FillNaN(vh + b * vh_size, vh_size);
      }
      continue;
    }
    if (jobz == 'N') continue;
    FromColumnMajor(lu.data(), u + b * u_size, m, ucols);
    FromColumnMajor(lvt.data(), vh + b * vh_size, vrows, n);
  }
}

template <typename T>
void Lu(const T* a, T* lu, int64_t* perm, int32_t* pivots, int64_t batch, int m, int n) {
  const int k = std::min(m, n), lda = std::max(m, 1);
  std::vector<T> x(static_cast<size_t>(m) * n);
  std::vector<int> ipiv(std::max(k, 1));
  const int64_t mn = static_cast<int64_t>(m) * n;
  for (int64_t b = 0; b < batch; ++b) {
    ToColumnMajor(a + b * mn, x.data(), m, n);
    int info = 0;
    lapack<T>().getrf(&m, &n, x.data(), &lda, ipiv.data(), &info);  // info > 0: a zero pivot, still factored
    int64_t* order = perm + b * m;
    for (int i = 0; i < m; ++i) order[i] = i;
    if (info < 0) {
      FillNaN(lu + b * mn, mn);
      for (int j = 0; j < k; ++j) pivots[b * k + j] = j + 1;
      continue;
    }
    FromColumnMajor(x.data(), lu + b * mn, m, n);
    for (int j = 0; j < k; ++j) {
      pivots[b * k + j] = ipiv[j];
      std::swap(order[j], order[ipiv[j] - 1]);
    }
  }
}

template <typename T>
void Qr(const T* a, T* packed, T* tau, int64_t batch, int m, int n) {
  const int k = std::min(m, n), lda = std::max(m, 1);
  std::vector<T> x(static_cast<size_t>(m) * n);
  int lwork = -1, info = 0;
  T work_size = 0;
  lapack<T>().geqrf(&m, &n, x.data(), &lda, tau, &work_size, &lwork, &info);
  lwork = std::max(static_cast<int>(work_size), 1);
  std::vector<T> work(lwork);
  const int64_t mn = static_cast<int64_t>(m) * n;
  for (int64_t b = 0; b < batch; ++b) {
    ToColumnMajor(a + b * mn, x.data(), m, n);
    lapack<T>().geqrf(&m, &n, x.data(), &lda, tau + b * k, work.data(), &lwork, &info);
    if (info != 0) {
      FillNaN(packed + b * mn, mn);
      FillNaN(tau + b * k, k);
      continue;
    }
    FromColumnMajor(x.data(), packed + b * mn, m, n);
  }
}

// The reflectors' columns (the first min(n, c) of packed, the rest zero) are where orgqr
// builds the c columns of Q.
template <typename T>
void QFactor(const T* packed, const T* tau, T* q, int64_t batch, int m, int n, int t, int c) {
  const int lda = std::max(m, 1), used = std::min(n, c);
  std::vector<T> x(static_cast<size_t>(m) * c);
  int lwork = -1, info = 0;
  T work_size = 0;
  lapack<T>().orgqr(&m, &c, &t, x.data(), &lda, tau, &work_size, &lwork, &info);
  lwork = std::max(static_cast<int>(work_size), 1);
  std::vector<T> work(lwork);
  const int64_t mn = static_cast<int64_t>(m) * n, mc = static_cast<int64_t>(m) * c;
  for (int64_t b = 0; b < batch; ++b) {
    std::fill(x.begin(), x.end(), T(0));
    const T* src = packed + b * mn;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < used; ++j) x[i + j * m] = src[i * n + j];
    lapack<T>().orgqr(&m, &c, &t, x.data(), &lda, tau + b * t, work.data(), &lwork, &info);
    if (info != 0) {
      FillNaN(q + b * mc, mc);
      continue;
    }
    FromColumnMajor(x.data(), q + b * mc, m, c);
  }
}

template <typename T>
void Cholesky(const T* a, T* l, int32_t* info, int64_t batch, int n) {
  const int lda = std::max(n, 1);
  std::vector<T> x(static_cast<size_t>(n) * n);
  const int64_t nn = static_cast<int64_t>(n) * n;
  for (int64_t b = 0; b < batch; ++b) {
    ToColumnMajor(a + b * nn, x.data(), n, n);
    int status = 0;
    lapack<T>().potrf("L", &n, x.data(), &lda, &status);
    info[b] = status;
    T* out = l + b * nn;
    FromColumnMajor(x.data(), out, n, n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) out[i * n + j] = T(0);
  }
}

bool Float(const FfiBuffer* x) { return x->dtype == kFfiF32 || x->dtype == kFfiF64; }

// Calls f with a value of the C++ type of an f32 or f64 buffer's elements (the tag picks T).
template <typename F>
void WithElementType(int dtype, F&& f) {
  if (dtype == kFfiF32)
    f(float{});
  else
    f(double{});
}

}  // namespace

extern "C" {

// Hands over LAPACK's drivers: `count` pointers, the s... drivers then the d... ones, each in
// Drivers' order (syevd, gesdd, getrf, geqrf, orgqr, potrf). The handlers are registered only
// once all are there.
__attribute__((visibility("default"))) int torchtpu_set_lapack(void* const* drivers, int count) {
  if (count != 2 * Drivers<float>::kCount) return -1;
  g_float.Set(drivers);
  g_double.Set(drivers + Drivers<float>::kCount);
  return 0;
}

// 1 when torchtpu_set_lapack has supplied every driver.
__attribute__((visibility("default"))) int torchtpu_lapack_available() {
  return g_float.Complete() && g_double.Complete() ? 1 : 0;
}

// XLA FFI handler (custom call api_version 4) for torchtpu_eigh_v1.
__attribute__((visibility("default"))) void* torchtpu_eigh(FfiCallFrame* frame) {
  if (AnswerMetadata(frame)) return nullptr;
  const FfiApi* api = frame->api;
  if (!torchtpu_lapack_available()) return Fail(api, "torchtpu_eigh: LAPACK was not supplied");
  if (frame->args.size != 2 || frame->rets.size != 2) return Fail(api, "torchtpu_eigh: 2 operands, 2 results");
  const FfiBuffer *a = Buf(frame->args, 0), *upper = Buf(frame->args, 1);
  const FfiBuffer *w = Buf(frame->rets, 0), *v = Buf(frame->rets, 1);
  if (upper->dtype != kFfiS32 || upper->rank != 0) return Fail(api, "torchtpu_eigh: `upper` must be an s32 scalar");
  const char* uplo = *static_cast<const int32_t*>(upper->data) != 0 ? "U" : "L";
  if (!Float(a) || w->dtype != a->dtype || v->dtype != a->dtype) return Fail(api, "torchtpu_eigh: f32 or f64 only");
  if (a->rank != 3 || w->rank != 2 || v->rank != 3)
    return Fail(api, "torchtpu_eigh: expected [B, n, n] -> [B, n], [B, n, n]");
  int64_t batch, n, cols;
  Dims(a, &batch, &n, &cols);
  if (cols != n || w->dims[0] != batch || w->dims[1] != n || v->dims[0] != batch || v->dims[1] != n || v->dims[2] != n)
    return Fail(api, "torchtpu_eigh: result shapes do not match a batch of square matrices");
  if (n > std::numeric_limits<int>::max() / 4) return Fail(api, "torchtpu_eigh: matrix too large for LAPACK");
  if (batch == 0 || n == 0) return nullptr;
  WithElementType(a->dtype, [&](auto tag) {
    using T = decltype(tag);
    Eigh(static_cast<const T*>(a->data), static_cast<T*>(w->data), static_cast<T*>(v->data), batch,
         static_cast<int>(n), uplo);
  });
  return nullptr;
}

// XLA FFI handler (custom call api_version 4) for torchtpu_svd_v1.
__attribute__((visibility("default"))) void* torchtpu_svd(FfiCallFrame* frame) {
  if (AnswerMetadata(frame)) return nullptr;
  const FfiApi* api = frame->api;
  if (!torchtpu_lapack_available()) return Fail(api, "torchtpu_svd: LAPACK was not supplied");
  if (frame->args.size != 1 || (frame->rets.size != 1 && frame->rets.size != 3))
    return Fail(api, "torchtpu_svd: 1 operand, 1 result (s) or 3 (u, s, vh)");
  const FfiBuffer* a = Buf(frame->args, 0);
  if (!Float(a) || a->rank != 3) return Fail(api, "torchtpu_svd: f32 or f64 operand [B, m, n]");
  int64_t batch, m, n;
  Dims(a, &batch, &m, &n);
  const int64_t k = std::min(m, n);
  if (m > std::numeric_limits<int>::max() / 8 || n > std::numeric_limits<int>::max() / 8)
    return Fail(api, "torchtpu_svd: matrix too large for LAPACK");
  const bool uv = frame->rets.size == 3;
  const FfiBuffer* s = Buf(frame->rets, uv ? 1 : 0);
  const FfiBuffer* u = uv ? Buf(frame->rets, 0) : nullptr;
  const FfiBuffer* vh = uv ? Buf(frame->rets, 2) : nullptr;
  for (const FfiBuffer* r : {s, u, vh})
    if (r != nullptr && (r->dtype != a->dtype || r->rank != (r == s ? 2 : 3) || r->dims[0] != batch))
      return Fail(api, "torchtpu_svd: results must match the operand's dtype and batch");
  if (s->dims[1] != k) return Fail(api, "torchtpu_svd: s must be [B, min(m, n)]");
  char jobz = 'N';
  if (uv) {
    const bool reduced = u->dims[1] == m && u->dims[2] == k && vh->dims[1] == k && vh->dims[2] == n;
    const bool full = u->dims[1] == m && u->dims[2] == m && vh->dims[1] == n && vh->dims[2] == n;
    if (!reduced && !full) return Fail(api, "torchtpu_svd: u, vh must be [B, m, k], [B, k, n] or [B, m, m], [B, n, n]");
    jobz = reduced ? 'S' : 'A';
  }
  if (batch == 0 || k == 0) return nullptr;  // the lowering handles empty matrices itself
  WithElementType(a->dtype, [&](auto tag) {
    using T = decltype(tag);
    Svd(static_cast<const T*>(a->data), uv ? static_cast<T*>(u->data) : nullptr, static_cast<T*>(s->data),
        uv ? static_cast<T*>(vh->data) : nullptr, batch, static_cast<int>(m), static_cast<int>(n), jobz);
  });
  return nullptr;
}

// XLA FFI handler (custom call api_version 4) for torchtpu_lu_v1.
__attribute__((visibility("default"))) void* torchtpu_lu(FfiCallFrame* frame) {
  if (AnswerMetadata(frame)) return nullptr;
  const FfiApi* api = frame->api;
  if (!torchtpu_lapack_available()) return Fail(api, "torchtpu_lu: LAPACK was not supplied");
  if (frame->args.size != 1 || frame->rets.size != 3) return Fail(api, "torchtpu_lu: 1 operand, 3 results");
  const FfiBuffer* a = Buf(frame->args, 0);
  const FfiBuffer *lu = Buf(frame->rets, 0), *perm = Buf(frame->rets, 1), *pivots = Buf(frame->rets, 2);
  if (!Float(a) || a->rank != 3 || lu->dtype != a->dtype || lu->rank != 3)
    return Fail(api, "torchtpu_lu: f32 or f64 [B, m, n] operand and LU");
  int64_t batch, m, n;
  Dims(a, &batch, &m, &n);
  const int64_t k = std::min(m, n);
  if (m > std::numeric_limits<int>::max() || n > std::numeric_limits<int>::max())
    return Fail(api, "torchtpu_lu: matrix too large for LAPACK");
  if (lu->dims[0] != batch || lu->dims[1] != m || lu->dims[2] != n || perm->dtype != kFfiS64 || perm->rank != 2 ||
      perm->dims[0] != batch || perm->dims[1] != m || pivots->dtype != kFfiS32 || pivots->rank != 2 ||
      pivots->dims[0] != batch || pivots->dims[1] != k)
    return Fail(api, "torchtpu_lu: results must be T[B, m, n], s64[B, m], s32[B, min(m, n)]");
  if (batch == 0 || m == 0 || n == 0) return nullptr;  // the lowering handles empty matrices itself
  WithElementType(a->dtype, [&](auto tag) {
    using T = decltype(tag);
    Lu(static_cast<const T*>(a->data), static_cast<T*>(lu->data), static_cast<int64_t*>(perm->data),
       static_cast<int32_t*>(pivots->data), batch, static_cast<int>(m), static_cast<int>(n));
  });
  return nullptr;
}

// XLA FFI handler (custom call api_version 4) for torchtpu_geqrf_v1.
__attribute__((visibility("default"))) void* torchtpu_geqrf(FfiCallFrame* frame) {
  if (AnswerMetadata(frame)) return nullptr;
  const FfiApi* api = frame->api;
  if (!torchtpu_lapack_available()) return Fail(api, "torchtpu_geqrf: LAPACK was not supplied");
  if (frame->args.size != 1 || frame->rets.size != 2) return Fail(api, "torchtpu_geqrf: 1 operand, 2 results");
  const FfiBuffer *a = Buf(frame->args, 0), *packed = Buf(frame->rets, 0), *tau = Buf(frame->rets, 1);
  if (!Float(a) || a->rank != 3 || packed->dtype != a->dtype || tau->dtype != a->dtype || packed->rank != 3 ||
      tau->rank != 2)
    return Fail(api, "torchtpu_geqrf: f32 or f64 [B, m, n] -> [B, m, n], [B, k]");
  int64_t batch, m, n;
  Dims(a, &batch, &m, &n);
  const int64_t k = std::min(m, n);
  if (m > std::numeric_limits<int>::max() || n > std::numeric_limits<int>::max())
    return Fail(api, "torchtpu_geqrf: matrix too large for LAPACK");
  if (packed->dims[0] != batch || packed->dims[1] != m || packed->dims[2] != n || tau->dims[0] != batch ||
      tau->dims[1] != k)
    return Fail(api, "torchtpu_geqrf: results must be [B, m, n] and [B, min(m, n)]");
  if (batch == 0 || k == 0) return nullptr;  // the lowering handles empty matrices itself
  WithElementType(a->dtype, [&](auto tag) {
    using T = decltype(tag);
    Qr(static_cast<const T*>(a->data), static_cast<T*>(packed->data), static_cast<T*>(tau->data), batch,
       static_cast<int>(m), static_cast<int>(n));
  });
  return nullptr;
}

// XLA FFI handler (custom call api_version 4) for torchtpu_orgqr_v1.
__attribute__((visibility("default"))) void* torchtpu_orgqr(FfiCallFrame* frame) {
  if (AnswerMetadata(frame)) return nullptr;
  const FfiApi* api = frame->api;
  if (!torchtpu_lapack_available()) return Fail(api, "torchtpu_orgqr: LAPACK was not supplied");
  if (frame->args.size != 2 || frame->rets.size != 1) return Fail(api, "torchtpu_orgqr: 2 operands, 1 result");
  const FfiBuffer *packed = Buf(frame->args, 0), *tau = Buf(frame->args, 1), *q = Buf(frame->rets, 0);
  if (!Float(packed) || packed->rank != 3 || tau->dtype != packed->dtype || q->dtype != packed->dtype ||
      tau->rank != 2 || q->rank != 3)
    return Fail(api, "torchtpu_orgqr: f32 or f64 [B, m, n], [B, t] -> [B, m, c]");
  int64_t batch, m, n;
  Dims(packed, &batch, &m, &n);
  const int64_t t = tau->dims[1], c = q->dims[2];
  if (m > std::numeric_limits<int>::max() || n > std::numeric_limits<int>::max())
    return Fail(api, "torchtpu_orgqr: matrix too large for LAPACK");
  if (tau->dims[0] != batch || q->dims[0] != batch || q->dims[1] != m || t > c || c > m || t > n)
    return Fail(api, "torchtpu_orgqr: needs tau [B, t] and q [B, m, c] with t <= min(n, c), c <= m");
  if (batch == 0 || m == 0 || c == 0) return nullptr;  // the lowering handles empty matrices itself
  WithElementType(packed->dtype, [&](auto tag) {
    using T = decltype(tag);
    QFactor(static_cast<const T*>(packed->data), static_cast<const T*>(tau->data), static_cast<T*>(q->data), batch,
            static_cast<int>(m), static_cast<int>(n), static_cast<int>(t), static_cast<int>(c));
  });
  return nullptr;
}

// XLA FFI handler (custom call api_version 4) for torchtpu_cholesky_v1.
__attribute__((visibility("default"))) void* torchtpu_cholesky(FfiCallFrame* frame) {
  if (AnswerMetadata(frame)) return nullptr;
  const FfiApi* api = frame->api;
  if (!torchtpu_lapack_available()) return Fail(api, "torchtpu_cholesky: LAPACK was not supplied");
  if (frame->args.size != 1 || frame->rets.size != 2) return Fail(api, "torchtpu_cholesky: 1 operand, 2 results");
  const FfiBuffer *a = Buf(frame->args, 0), *l = Buf(frame->rets, 0), *info = Buf(frame->rets, 1);
  if (!Float(a) || a->rank != 3 || l->dtype != a->dtype || l->rank != 3 || info->dtype != kFfiS32 || info->rank != 1)
    return Fail(api, "torchtpu_cholesky: f32 or f64 [B, n, n] -> [B, n, n], s32[B]");
  int64_t batch, n, cols;
  Dims(a, &batch, &n, &cols);
  if (cols != n || n > std::numeric_limits<int>::max()) return Fail(api, "torchtpu_cholesky: square matrices only");
  if (l->dims[0] != batch || l->dims[1] != n || l->dims[2] != n || info->dims[0] != batch)
    return Fail(api, "torchtpu_cholesky: results must be [B, n, n] and [B]");
  if (batch == 0 || n == 0) return nullptr;  // the lowering handles empty matrices itself
  WithElementType(a->dtype, [&](auto tag) {
    using T = decltype(tag);
    Cholesky(static_cast<const T*>(a->data), static_cast<T*>(l->data), static_cast<int32_t*>(info->data), batch,
             static_cast<int>(n));
  });
  return nullptr;
}

}  // extern "C"
