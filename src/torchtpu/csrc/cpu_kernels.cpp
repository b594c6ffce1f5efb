// Host-CPU kernels that XLA programs call as custom calls (XLA:CPU plugin only).
//
// XLA's CPU backend emits a transpose as an elemental loop that reads its input
// with a stride: about 1 ns per element (170 us for a 512 x 384 bf16 operand),
// several times the cost of the data it moves. Every weight gradient of a
// linear layer (x^T @ g) needs one, laid out row-major for the dot. In a fused
// DeferAndFuse program it is worse: XLA fuses the elementwise producer of the
// operand (a GELU backward, say) into that strided loop, so every input of the
// producer is read with the stride too (on an AVX2 machine, 16% of a GPT step's
// CPU went to such loops). This file supplies the transpose as a custom call:
//
//   torchtpu_transpose_v1(x: T[..., R, C]) -> U[..., C, R]     T, U in {f32, bf16}
//
// done in registers, 16 x 16 elements at a time with AVX-512 or 8 x 8 with AVX2
// (bf16 is widened to 32 bits, which is exact, and narrowed back with
// round-to-nearest-even). It is a typed XLA FFI handler (custom call
// api_version 4: shapes come with the buffers), registered through the PJRT FFI
// extension of the plugin.
//
// No PyTorch here: the runtime layer loads this library with ctypes.

#include <cpuid.h>
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_ffi.h"

namespace {

using namespace torchtpu_cpu;  // NOLINT: the FFI layouts (cpu_ffi.h)

// ---- the CPU features the kernels need --------------------------------------

enum class Isa { kNone, kAvx2, kAvx512 };

Isa DetectIsa() {
  __builtin_cpu_init();  // (idempotent) in case this runs before libgcc's own constructor did
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return Isa::kNone;
  const bool avx512f = (ebx >> 16) & 1, avx512bw = (ebx >> 30) & 1;
  bool avx512_bf16 = false;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) avx512_bf16 = (eax >> 5) & 1;
  // __builtin_cpu_supports also checks that the OS saves the vector registers
  if (avx512f && avx512bw && avx512_bf16 && __builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
  return Isa::kNone;
}

Isa CurrentIsa() {
  static const Isa isa = DetectIsa();
  return isa;
}

bool FeaturesAvailable() { return CurrentIsa() != Isa::kNone; }

// ---- transpose ----------------------------------------------------------------

// GCC 12 flags its own _mm512_unpack* intrinsics (an undefined pass-through
// operand inside the header) under -Wall; nothing here reads it.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// r[i] holds row i of a 16 x 16 block of 32-bit values; afterwards r[j] holds
// column j. The usual unpack / shuffle network of AVX-512.
__attribute__((target("avx512f"), always_inline)) inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// 16 consecutive elements from src[index], as f32 bit patterns.
template <bool kBf16In>
__attribute__((target("avx512f"), always_inline)) inline __m512i LoadRow(const void* src, int64_t index) {
  if constexpr (kBf16In) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(src) + index));
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);  // bf16 -> f32 is exact
  } else {
    return _mm512_loadu_si512(static_cast<const uint32_t*>(src) + index);
  }
}

template <bool kBf16Out>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void StoreRow(void* dst, int64_t index, __m512i v) {
  if constexpr (kBf16Out) {
    // Round to nearest even (NaN stays NaN): what XLA's f32 -> bf16 convert does.
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_castsi512_ps(v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + index),
                        reinterpret_cast<const __m256i&>(h));
  } else {
    _mm512_storeu_si512(static_cast<uint32_t*>(dst) + index, v);
  }
}

inline uint32_t LoadOne(const void* src, int64_t index, bool bf16) {
  if (bf16) return static_cast<uint32_t>(static_cast<const uint16_t*>(src)[index]) << 16;
  return static_cast<const uint32_t*>(src)[index];
}

inline void StoreOne(void* dst, int64_t index, uint32_t bits, bool bf16) {
  if (!bf16) {
    static_cast<uint32_t*>(dst)[index] = bits;
    return;
  }
  uint16_t out;
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    out = static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  } else {
    out = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
  }
  static_cast<uint16_t*>(dst)[index] = out;
}

// The ragged right and bottom edges outside the full blocks, one element at a time.
void TransposeEdges(const void* src, void* dst, int64_t rows, int64_t cols, int64_t full_rows, int64_t full_cols,
                    bool bf16_in, bool bf16_out) {
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t col = row < full_rows ? full_cols : 0; col < cols; ++col)
      StoreOne(dst, col * rows + row, LoadOne(src, row * cols + col, bf16_in), bf16_out);
  }
}

// bf16 -> bf16, 32 rows x 16 columns at a time: rows 2i and 2i+1 interleaved make one
// vector of 32-bit pairs, and a 16 x 16 transpose of those pairs leaves each column's
// 32 values in order in one register. Half the shuffles per element of widening to f32.
__attribute__((target("avx512f,avx512bw"))) void TransposeBf16Blocks(const uint16_t* src, uint16_t* dst,
                                                                    int64_t rows, int64_t cols,
                                                                    int64_t full_rows, int64_t full_cols) {
  alignas(64) uint16_t order[32];
  for (int j = 0; j < 16; ++j) {
    order[2 * j] = static_cast<uint16_t>(j);            // row 2i, column j
    order[2 * j + 1] = static_cast<uint16_t>(32 + j);  // row 2i + 1, column j
  }
  const __m512i interleave = _mm512_load_si512(order);
  __m512i r[16];
  for (int64_t r0 = 0; r0 < full_rows; r0 += 32) {
    for (int64_t c0 = 0; c0 < full_cols; c0 += 16) {
      for (int i = 0; i < 16; ++i) {
        const __m256i even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (r0 + 2 * i) * cols + c0));
        const __m256i odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (r0 + 2 * i + 1) * cols + c0));
        r[i] = _mm512_permutex2var_epi16(_mm512_castsi256_si512(even), interleave, _mm512_castsi256_si512(odd));
      }
      Transpose16x16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + (c0 + j) * rows + r0, r[j]);
    }
  }
}

// dst[C, R] = src[R, C]^T for one matrix of the batch.
template <bool kBf16In, bool kBf16Out>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void TransposeMatrixAvx512(const void* src, void* dst,
                                                                            int64_t rows, int64_t cols) {
  constexpr int64_t kRowBlock = kBf16In && kBf16Out ? 32 : 16;
  const int64_t full_rows = rows / kRowBlock * kRowBlock, full_cols = cols / 16 * 16;
  if constexpr (kBf16In && kBf16Out) {
    TransposeBf16Blocks(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), rows, cols, full_rows,
                        full_cols);
  } else {
    __m512i r[16];
    for (int64_t r0 = 0; r0 < full_rows; r0 += 16) {
      for (int64_t c0 = 0; c0 < full_cols; c0 += 16) {
        for (int i = 0; i < 16; ++i) r[i] = LoadRow<kBf16In>(src, (r0 + i) * cols + c0);
        Transpose16x16(r);
        for (int j = 0; j < 16; ++j) StoreRow<kBf16Out>(dst, (c0 + j) * rows + r0, r[j]);
      }
    }
  }
  TransposeEdges(src, dst, rows, cols, full_rows, full_cols, kBf16In, kBf16Out);
}

// ---- the same with AVX2: 8 x 8 blocks of 32-bit values ---------------------------

// r[i] holds row i of an 8 x 8 block; afterwards r[j] holds column j.
__attribute__((target("avx2"), always_inline)) inline void Transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);      // columns 0, 1 | 4, 5 of two rows
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);  // columns 2, 3 | 6, 7
  }
  for (int i = 0; i < 8; i += 4) {  // per four rows: columns j | j + 4, for j = 0..3
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
    r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
  }
}

template <bool kBf16In>
__attribute__((target("avx2"), always_inline)) inline __m256 LoadRow8(const void* src, int64_t index) {
  if constexpr (kBf16In) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(src) + index));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // exact
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(src) + index);
  }
}

template <bool kBf16Out>
__attribute__((target("avx2"), always_inline)) inline void StoreRow8(void* dst, int64_t index, __m256 v) {
  if constexpr (kBf16Out) {
    // StoreOne's rounding, 8 lanes at a time: round to nearest even, NaN stays a quiet NaN.
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256i out = _mm256_blendv_epi8(rounded, quiet, nan);  // 8 lanes, each < 2^16
    // pack to 16 bits: [0..3, 0..3 | 4..7, 4..7]; then the low 64 bits of each half, in order
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(dst) + index),
                     _mm256_castsi256_si128(packed));
  } else {
    _mm256_storeu_ps(static_cast<float*>(dst) + index, v);
  }
}

template <bool kBf16In, bool kBf16Out>
__attribute__((target("avx2"))) void TransposeMatrixAvx2(const void* src, void* dst, int64_t rows, int64_t cols) {
  const int64_t full_rows = rows / 8 * 8, full_cols = cols / 8 * 8;
  // Tiles of kTile x kTile, so that the destination lines a tile writes 32 or 16 bytes at a
  // time are still in cache when the next block of the tile fills them up.
  constexpr int64_t kTile = 64;
  __m256 r[8];
  for (int64_t rt = 0; rt < full_rows; rt += kTile) {
    const int64_t r_end = rt + kTile < full_rows ? rt + kTile : full_rows;
    for (int64_t ct = 0; ct < full_cols; ct += kTile) {
      const int64_t c_end = ct + kTile < full_cols ? ct + kTile : full_cols;
      for (int64_t c0 = ct; c0 < c_end; c0 += 8) {
        for (int64_t r0 = rt; r0 < r_end; r0 += 8) {
          for (int i = 0; i < 8; ++i) r[i] = LoadRow8<kBf16In>(src, (r0 + i) * cols + c0);
          Transpose8x8(r);
          for (int j = 0; j < 8; ++j) StoreRow8<kBf16Out>(dst, (c0 + j) * rows + r0, r[j]);
        }
      }
    }
  }
  TransposeEdges(src, dst, rows, cols, full_rows, full_cols, kBf16In, kBf16Out);
}

template <bool kBf16In, bool kBf16Out>
void TransposeBatch(const void* src, void* dst, int64_t batch, int64_t rows, int64_t cols, Isa isa) {
  const int64_t in_size = kBf16In ? 2 : 4, out_size = kBf16Out ? 2 : 4;
  const bool avx512 = isa == Isa::kAvx512;
  for (int64_t b = 0; b < batch; ++b) {
    const void* from = static_cast<const char*>(src) + b * rows * cols * in_size;
    void* to = static_cast<char*>(dst) + b * rows * cols * out_size;
    if (avx512) {
      TransposeMatrixAvx512<kBf16In, kBf16Out>(from, to, rows, cols);
    } else {
      TransposeMatrixAvx2<kBf16In, kBf16Out>(from, to, rows, cols);
    }
  }
}

void Transpose(const void* src, bool bf16_in, void* dst, bool bf16_out, int64_t batch, int64_t rows,
               int64_t cols, Isa isa = CurrentIsa()) {
  if (bf16_in && bf16_out) {
    TransposeBatch<true, true>(src, dst, batch, rows, cols, isa);
  } else if (bf16_in) {
    TransposeBatch<true, false>(src, dst, batch, rows, cols, isa);
  } else if (bf16_out) {
    TransposeBatch<false, true>(src, dst, batch, rows, cols, isa);
  } else {
    TransposeBatch<false, false>(src, dst, batch, rows, cols, isa);
  }
}

}  // namespace

extern "C" {

// XLA FFI handler (custom call api_version 4) for torchtpu_transpose_v1.
__attribute__((visibility("default"))) void* torchtpu_transpose(FfiCallFrame* frame) {
  if (AnswerMetadata(frame)) return nullptr;
  const FfiApi* api = frame->api;
  if (frame->args.size != 1 || frame->rets.size != 1) return Fail(api, "torchtpu_transpose: 1 operand, 1 result");
  const auto* x = static_cast<const FfiBuffer*>(frame->args.items[0]);
  const auto* y = static_cast<const FfiBuffer*>(frame->rets.items[0]);
  if ((x->dtype != kFfiBf16 && x->dtype != kFfiF32) || (y->dtype != kFfiBf16 && y->dtype != kFfiF32))
    return Fail(api, "torchtpu_transpose: f32 or bf16 operand and result");
  if (x->rank < 2 || y->rank != x->rank) return Fail(api, "torchtpu_transpose: operand rank < 2 or ranks differ");
  const int64_t rank = x->rank, rows = x->dims[rank - 2], cols = x->dims[rank - 1];
  int64_t batch = 1;
  for (int64_t d = 0; d < rank - 2; ++d) {
    if (y->dims[d] != x->dims[d]) return Fail(api, "torchtpu_transpose: batch dims differ");
    batch *= x->dims[d];
  }
  if (y->dims[rank - 2] != cols || y->dims[rank - 1] != rows)
    return Fail(api, "torchtpu_transpose: result is not the operand's last two dims swapped");
  if (!FeaturesAvailable()) return Fail(api, "torchtpu_transpose: this CPU lacks AVX2");
  Transpose(x->data, x->dtype == kFfiBf16, y->data, y->dtype == kFfiBf16, batch, rows, cols);
  return nullptr;
}

// The same transpose on plain pointers (tests compare it with numpy). avx2_only: the AVX2
// code even where AVX-512 would be used, so that both are tested on an AVX-512 machine.
__attribute__((visibility("default"))) int torchtpu_transpose_host(const void* src, int bf16_in, void* dst,
                                                                   int bf16_out, int64_t batch, int64_t rows,
                                                                   int64_t cols, int avx2_only) {
  if (!FeaturesAvailable()) return -1;
  Transpose(src, bf16_in != 0, dst, bf16_out != 0, batch, rows, cols, avx2_only ? Isa::kAvx2 : CurrentIsa());
  return 0;
}

// 1 when this CPU can run the transpose.
__attribute__((visibility("default"))) int torchtpu_cpu_kernels_available() { return FeaturesAvailable() ? 1 : 0; }

void* torchtpu_eigh(FfiCallFrame* frame);  // cpu_linalg.cpp
void* torchtpu_svd(FfiCallFrame* frame);
void* torchtpu_lu(FfiCallFrame* frame);
void* torchtpu_geqrf(FfiCallFrame* frame);
void* torchtpu_orgqr(FfiCallFrame* frame);
void* torchtpu_cholesky(FfiCallFrame* frame);
int torchtpu_lapack_available();

// Registers the custom calls this process can run with a PJRT plugin's FFI extension for
// XLA:CPU ("Host"): the transpose where the CPU has AVX2 at least, the LAPACK kernels where
// LAPACK was supplied. Returns which (1: transpose, 2: LAPACK's), or -1 when the plugin
// has no FFI extension; a PJRT error from the plugin is handed back through *error for the
// caller to read and destroy.
// Registers the kernels of ``kinds`` (1: the transpose, 2: the LAPACK ones, each once per plugin:
// the caller asks again only for what is missing) and returns the kinds registered.
__attribute__((visibility("default"))) int torchtpu_register_cpu_kernels(const void* api, int kinds, void** error) {
  *error = nullptr;
  const auto* prefix = static_cast<const PjrtApiPrefix*>(api);
  const ExtensionBase* ext = prefix->extension_start;
  while (ext != nullptr && ext->type != kPjrtExtensionTypeFfi) ext = ext->next;
  if (ext == nullptr) return -1;
  const auto* ffi = reinterpret_cast<const PjrtFfiExtension*>(ext);
  const auto add = [&](const char* target, void* (*handler)(FfiCallFrame*)) {
    static const char kPlatform[] = "Host";
    RegisterHandlerArgs args{};
    args.struct_size = offsetof(RegisterHandlerArgs, traits) + sizeof(args.traits);
    args.target_name = target;
    args.target_name_size = std::strlen(target);
    args.handler = reinterpret_cast<void*>(handler);
    args.platform_name = kPlatform;
    args.platform_name_size = sizeof(kPlatform) - 1;
    *error = ffi->register_handler(&args);
    return *error == nullptr;
  };
  int registered = 0;
  if ((kinds & 1) && FeaturesAvailable()) {
    if (!add("torchtpu_transpose_v1", &torchtpu_transpose)) return registered;
    registered |= 1;
  }
  if ((kinds & 2) && torchtpu_lapack_available()) {
    if (!add("torchtpu_eigh_v1", &torchtpu_eigh) || !add("torchtpu_svd_v1", &torchtpu_svd) ||
        !add("torchtpu_lu_v1", &torchtpu_lu) || !add("torchtpu_geqrf_v1", &torchtpu_geqrf) ||
        !add("torchtpu_orgqr_v1", &torchtpu_orgqr) || !add("torchtpu_cholesky_v1", &torchtpu_cholesky))
      return registered;
    registered |= 2;
  }
  return registered;
}

}  // extern "C"
