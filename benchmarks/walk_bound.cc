// The walk's structure alone, for `ort-mx-bench --walk-bound` (benchmarks/walk_bound.py, which
// compiles this file with the machine's C++ compiler and runs it).
//
// A block quantize-dequantize with the blocked axis outer reads each block's rows, takes the
// greatest magnitude down every column, then reads the rows again to write the results: the
// CPU walker's row and column walks (csrc/cpu/block_walker.h). This program times those walk
// structures with one vector operation per element in place of a format's arithmetic,
// y = min(x, m) with m the block's greatest magnitude in that column (so y equals x, which
// the program checks bit for bit), against a negation loop compiled for the baseline
// instruction set as onnxruntime's Neg is. Where even this stays below a ratio the op must
// reach, no walk of that structure can reach it on this machine.
//
//   walk_bound ROWS COLS BLOCK ROUNDS [OUTPUT_OFFSET]  ->  one JSON object on stdout
//
// Both buffers start on 2 MiB boundaries, so by default the output's rows fall into the same
// L1 sets as the input's; OUTPUT_OFFSET (bytes, a multiple of 64 below 4096) moves the output
// that far past its boundary, as a separate allocation may lie.
//
// Built twice: with -DWALK_BOUND_NEGATION at the baseline flags for the negation loop alone,
// and without it at -march=native for the walks and main.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" void walk_bound_negation(const float* x, float* y, int64_t n);

#ifdef WALK_BOUND_NEGATION

extern "C" void walk_bound_negation(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = -x[i];
}

#else

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <vector>
#ifdef __linux__
#include <sys/mman.h>
#endif

namespace {

#if defined(__AVX512F__)
constexpr int W = 16;
#elif defined(__AVX2__)
constexpr int W = 8;
#else
constexpr int W = 4;
#endif
typedef float V __attribute__((vector_size(4 * W)));
typedef int32_t VI __attribute__((vector_size(4 * W)));

inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
inline V magnitude(V v) { return (V)((VI)v & 0x7fffffff); }
inline V vmax(V a, V b) { return a > b ? a : b; }
inline V vmin(V a, V b) { return a < b ? a : b; }

struct Tensor {
  const float* x;
  float* y;
  int64_t rows, cols, block;
  V* maxima;  // cols / W vectors for the row walks' running column maxima (allocated once)
};

// Whole rows, as the row walk: the block's rows in order into running column maxima, then
// the rows again (Reversed: from the block's last row up, so the rows read last come first).
template <bool Reversed>
void rows(const Tensor& t) {
  V* const m = t.maxima;
  for (int64_t b = 0; b < t.rows; b += t.block) {
    const float* p = t.x + b * t.cols;
    float* q = t.y + b * t.cols;
    for (int64_t c = 0; c < t.cols / W; ++c) m[c] = V{};
    for (int64_t j = 0; j < t.block; ++j)
      for (int64_t c = 0; c < t.cols / W; ++c) m[c] = vmax(m[c], magnitude(load(p + j * t.cols + c * W)));
    for (int64_t i = 0; i < t.block; ++i) {
      const int64_t j = Reversed ? t.block - 1 - i : i;
      for (int64_t c = 0; c < t.cols / W; ++c)
        store(q + j * t.cols + c * W, vmin(load(p + j * t.cols + c * W), m[c]));
    }
  }
}

// One column vector at a time down the block's kN rows: the maximum, then the rows again,
// from the L1 cache where they stayed (InRegisters: from the kN vectors read the first time,
// which AVX-512's 32 registers can hold for kN = 32).
template <int kN, bool InRegisters>
void columns(const Tensor& t) {
  for (int64_t b = 0; b < t.rows; b += kN)
    for (int64_t c = 0; c < t.cols; c += W) {
      const float* p = t.x + b * t.cols + c;
      float* q = t.y + b * t.cols + c;
      V v[InRegisters ? kN : 1];
      V m = V{};
#pragma GCC unroll 32
      for (int j = 0; j < kN; ++j) {
        const V x = load(p + j * t.cols);
        if (InRegisters) v[j] = x;
        m = vmax(m, magnitude(x));
      }
#pragma GCC unroll 32
      for (int j = 0; j < kN; ++j) store(q + j * t.cols, vmin(InRegisters ? v[j] : load(p + j * t.cols), m));
    }
}

// Two column vectors at a time down the block's kN rows, copied into a local buffer by the
// first pass, which the second pass reads (the column walk's kept rows).
template <int kN>
void columns_kept(const Tensor& t) {
  alignas(64) float keep[kN][2 * W];
  for (int64_t b = 0; b < t.rows; b += kN)
    for (int64_t c = 0; c < t.cols; c += 2 * W) {
      const float* p = t.x + b * t.cols + c;
      float* q = t.y + b * t.cols + c;
      V m0 = V{}, m1 = V{};
#pragma GCC unroll 4
      for (int j = 0; j < kN; ++j) {
        const V x0 = load(p + j * t.cols), x1 = load(p + j * t.cols + W);
        store(keep[j], x0);
        store(keep[j] + W, x1);
        m0 = vmax(m0, magnitude(x0));
        m1 = vmax(m1, magnitude(x1));
      }
#pragma GCC unroll 4
      for (int j = 0; j < kN; ++j) {
        store(q + j * t.cols, vmin(load(keep[j]), m0));
        store(q + j * t.cols + W, vmin(load(keep[j] + W), m1));
      }
    }
}

// Strips of kStripVectors column vectors of each row (1 KiB with AVX-512, 512 bytes with
// AVX2): the block's rows of a strip in order into the strip's column maxima, held in
// registers, then the strip's rows again (a tile walk as wide as the registers allow).
constexpr int64_t kStripVectors = 16;

template <int64_t kNv>
void strip(const Tensor& t, const float* p, float* q, int64_t nv) {
  const int64_t n = kNv > 0 ? kNv : nv;
  V m[kStripVectors] = {};
  for (int64_t j = 0; j < t.block; ++j)
#pragma GCC unroll 16
    for (int64_t c = 0; c < n; ++c) m[c] = vmax(m[c], magnitude(load(p + j * t.cols + c * W)));
  for (int64_t j = 0; j < t.block; ++j)
#pragma GCC unroll 16
    for (int64_t c = 0; c < n; ++c) store(q + j * t.cols + c * W, vmin(load(p + j * t.cols + c * W), m[c]));
}

void strips(const Tensor& t) {
  for (int64_t b = 0; b < t.rows; b += t.block)
    for (int64_t c0 = 0; c0 < t.cols; c0 += kStripVectors * W) {
      const float* p = t.x + b * t.cols + c0;
      float* q = t.y + b * t.cols + c0;
      const int64_t nv = std::min<int64_t>(kStripVectors, (t.cols - c0) / W);
      if (nv == kStripVectors) strip<kStripVectors>(t, p, q, nv);
      else strip<0>(t, p, q, nv);  // the last, narrower strip
    }
}

// Tiles of kTileColumns columns (512 bytes of each row, the kernel's tile): the first pass
// copies the block's rows of a tile into a local buffer (16 KiB for 32 rows) and takes the
// tile's column maxima, held in registers; the second reads the buffer (the kept tile).
constexpr int64_t kTileColumns = 128;

void tiles_kept(const Tensor& t) {
  constexpr int64_t kVectors = kTileColumns / W;
  alignas(64) static float keep[32 * kTileColumns];
  for (int64_t b = 0; b < t.rows; b += t.block)
    for (int64_t c0 = 0; c0 < t.cols; c0 += kTileColumns) {
      const float* p = t.x + b * t.cols + c0;
      float* q = t.y + b * t.cols + c0;
      const int64_t nv = std::min<int64_t>(kVectors, (t.cols - c0) / W);
      V m[kVectors] = {};
      for (int64_t j = 0; j < t.block; ++j)
        for (int64_t c = 0; c < nv; ++c) {
          const V v = load(p + j * t.cols + c * W);
          store(keep + j * kTileColumns + c * W, v);
          m[c] = vmax(m[c], magnitude(v));
        }
      for (int64_t j = 0; j < t.block; ++j)
        for (int64_t c = 0; c < nv; ++c) store(q + j * t.cols + c * W, vmin(load(keep + j * kTileColumns + c * W), m[c]));
    }
}

// walk(std::integral_constant<int, kN>) for the block's rows kN (8, 16 or 32): the column
// walks take kN at compile time, so their loops over the rows unroll.
template <class Walk>
void with_block_rows(const Tensor& t, Walk walk) {
  switch (t.block) {
    case 8: return walk(std::integral_constant<int, 8>{});
    case 16: return walk(std::integral_constant<int, 16>{});
    default: return walk(std::integral_constant<int, 32>{});
  }
}

template <bool InRegisters>
void columns_of_block(const Tensor& t) {
  with_block_rows(t, [&](auto n) { columns<decltype(n)::value, InRegisters>(t); });
}

void columns_kept_of_block(const Tensor& t) {
  with_block_rows(t, [&](auto n) { columns_kept<decltype(n)::value>(t); });
}

void negation(const Tensor& t) { walk_bound_negation(t.x, t.y, t.rows * t.cols); }

struct Walk {
  const char* name;
  void (*fn)(const Tensor&);
  bool checked;  // whether y == x afterwards (the negation's y is -x)
};

const Walk kWalks[] = {
    {"negation", negation, false},
    {"rows", rows<false>, true},
    {"rows_reversed", rows<true>, true},
    {"columns", columns_of_block<false>, true},
    {"columns_in_registers", columns_of_block<true>, true},
    {"columns_kept", columns_kept_of_block, true},
    {"strips", strips, true},
    {"tiles_kept", tiles_kept, true},
};

float* buffer(size_t bytes) {
  constexpr size_t kPage = size_t{1} << 21;
  void* p = std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
  if (p == nullptr) return nullptr;
#ifdef __linux__
  madvise(p, bytes, MADV_HUGEPAGE);  // the same cache sets in every run, where Linux grants it
#endif
  return static_cast<float*>(p);
}

int64_t parse(const char* s) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  return end != s && *end == '\0' ? v : -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: walk_bound ROWS COLS BLOCK ROUNDS [OUTPUT_OFFSET]\n");
    return 2;
  }
  const int64_t rows = parse(argv[1]), cols = parse(argv[2]), block = parse(argv[3]), rounds = parse(argv[4]);
  const int64_t offset = argc == 6 ? parse(argv[5]) : 0;
  if (rows <= 0 || cols <= 0 || rounds <= 0 || (block != 8 && block != 16 && block != 32) || rows % block != 0 ||
      cols % 32 != 0 || offset < 0 || offset >= 4096 || offset % 64 != 0) {
    std::fprintf(stderr,
                 "walk_bound: ROWS a positive multiple of BLOCK (8, 16 or 32), COLS of 32, ROUNDS > 0, "
                 "OUTPUT_OFFSET a multiple of 64 in [0, 4096)\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(rows * cols);
  float* x = buffer(n * sizeof(float));
  float* y_buffer = buffer(n * sizeof(float) + static_cast<size_t>(offset));
  float* y = y_buffer + offset / int64_t(sizeof(float));
  if (x == nullptr || y_buffer == nullptr) {
    std::fprintf(stderr, "walk_bound: out of memory for %zu floats\n", n);
    return 2;
  }
  // Finite values of varied magnitudes and both signs, -0 among them.
  uint32_t state = 12345u;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    x[i] = i % 97 == 0 ? -0.0f : (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * static_cast<float>(1 + i % 13);
  }
  std::vector<V> maxima(static_cast<size_t>(cols / W));
  const Tensor t{x, y, rows, cols, block, maxima.data()};
  constexpr size_t kWalkCount = sizeof kWalks / sizeof kWalks[0];
  std::vector<std::vector<double>> times(kWalkCount);
  for (const Walk& w : kWalks) w.fn(t);  // warm-up: pages touched, code in the caches
  // Rounds of every walk in turn, so that load from elsewhere hits them alike; each timed
  // call follows an untimed negation, so every walk finds x (and y) where a node would.
  for (int64_t r = 0; r < rounds; ++r)
    for (size_t k = 0; k < kWalkCount; ++k) {
      negation(t);
      const auto t0 = std::chrono::steady_clock::now();
      kWalks[k].fn(t);
      const auto t1 = std::chrono::steady_clock::now();
      times[k].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  std::printf("{\"lanes\": %d, \"rows\": %lld, \"cols\": %lld, \"block\": %lld, \"rounds\": %lld, "
              "\"output_offset\": %lld, \"walks\": [",
              W, static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(block),
              static_cast<long long>(rounds), static_cast<long long>(offset));
  int bad = 0;
  for (size_t k = 0; k < kWalkCount; ++k) {
    const Walk& w = kWalks[k];
    bool equal = true;
    if (w.checked) {
      std::memset(y, 0xff, n * sizeof(float));  // NaN everywhere: a skipped element shows
      w.fn(t);
      equal = std::memcmp(x, y, n * sizeof(float)) == 0;
      bad += !equal;
    }
    std::vector<double>& s = times[k];
    std::sort(s.begin(), s.end());
    std::printf("%s{\"name\": \"%s\", \"best_us\": %.3f, \"median_us\": %.3f, \"checked\": %s, \"equal\": %s}",
                k ? ", " : "", w.name, s.front(), s[s.size() / 2], w.checked ? "true" : "false",
                equal ? "true" : "false");
  }
  std::printf("]}\n");
  std::free(x);
  std::free(y_buffer);
  return bad ? 3 : 0;
}

#endif  // WALK_BOUND_NEGATION
