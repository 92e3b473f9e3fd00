// A host emulation of the few GPU features the kernels in this folder use, so their logic
// (indexing, lane groups, shuffles, tails) can be checked bit for bit on a machine with no
// GPU: compile the .cu files as C++ with -DMXOPS_GPU_EMULATION (tests/test_gpu_emulated.py
// does). Not part of any shipped build.
//
// A launch runs its CTAs one after another; the 32 lanes of each lane group run on 32 host
// threads in step, each shuffle being an exchange between two barriers. A lane group whose
// lanes do not all execute the same shuffles (which would be undefined on a GPU) aborts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "../common/numerics.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct MxopsEmuDim {
  unsigned x = 0, y = 1, z = 1;
};
inline thread_local MxopsEmuDim threadIdx, blockIdx;
inline thread_local MxopsEmuDim blockDim, gridDim;

using cudaStream_t = void*;
using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

#define MXOPS_GPU_EXECUTION_PROVIDER "CUDAExecutionProvider"
#define MXOPS_GPU_BACKEND_NAME "emulated GPU"

namespace mxops::gpu::emu {

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "mxops GPU emulation: %s\n", what);
  std::abort();
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    const unsigned gen = generation_;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return gen != generation_; }))
      die("lanes of a group did not meet (divergent shuffles or a hang)");
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  unsigned generation_ = 0;
};

struct Group {
  explicit Group(int lanes) : lanes(lanes), values(lanes), shuffles(lanes), bar(lanes) {}
  int lanes;
  std::vector<int> values;
  std::vector<long> shuffles;
  Barrier bar;
};

inline thread_local Group* group = nullptr;
inline thread_local int lane = 0;

inline int exchange(int v, int src) {
  Group& g = *group;
  if (src < 0 || src >= g.lanes) die("shuffle from a lane outside the group");
  ++g.shuffles[lane];
  g.values[lane] = v;
  g.bar.arrive_and_wait();
  const int r = g.values[src];
  g.bar.arrive_and_wait();
  return r;
}

template <class... P>
struct Launch {
  unsigned grid, block;
  void (*kernel)(P...);

  template <class... A>
  void operator()(A&&... args) const {
    const std::tuple<P...> params(static_cast<P>(args)...);
    const int lanes = block < 32 ? static_cast<int>(block) : 32;
    if (block % lanes != 0) die("block size must be a multiple of 32");
    Group g(lanes);
    std::vector<std::thread> workers;
    for (int l = 0; l < lanes; ++l) {
      workers.emplace_back([&, l] {
        group = &g;
        lane = l;
        blockDim.x = block;
        gridDim.x = grid;
        for (unsigned cta = 0; cta < grid; ++cta) {
          for (unsigned first = 0; first < block; first += lanes) {
            blockIdx.x = cta;
            threadIdx.x = first + l;
            std::apply(kernel, params);
            g.bar.arrive_and_wait();  // the group is done: every lane did the same shuffles
            if (g.shuffles[l] != g.shuffles[0]) die("lanes of a group shuffled unequally");
            g.bar.arrive_and_wait();
          }
        }
      });
    }
    for (auto& w : workers) w.join();
  }
};

template <class... P>
Launch<P...> launcher(unsigned grid, unsigned block, void (*kernel)(P...)) {
  return Launch<P...>{grid, block, kernel};
}

}  // namespace mxops::gpu::emu

#define MXOPS_LAUNCH(grid, block, stream, ...)                                    \
  ::mxops::gpu::emu::launcher(static_cast<unsigned>(grid), static_cast<unsigned>(block), \
                              __VA_ARGS__)

namespace mxops::gpu::port {
inline int shfl_xor(int v, int lane_mask) { return emu::exchange(v, emu::lane ^ lane_mask); }
inline int shfl_up(int v, int delta, int width) {
  const int first = emu::lane & ~(width - 1);
  const int src = emu::lane - delta;
  return emu::exchange(v, src < first ? emu::lane : src);
}
inline int shfl(int v, int src_lane, int width) {
  return emu::exchange(v, (emu::lane & ~(width - 1)) + src_lane);
}
inline bool all_lanes(bool p) {  // a butterfly of exchanges over the whole group
  int v = p ? 1 : 0;
  for (int m = 1; m < emu::group->lanes; m <<= 1) v &= emu::exchange(v, emu::lane ^ m);
  return v != 0;
}
// The GPU's float16 conversions: correctly rounded (Float16's code), and a NaN canonical as
// the hardware gives it, so the emulated kernels need the NaN handling the real ones do.
inline float half_to_float(uint16_t h) {
  return (h & 0x7fffu) > 0x7c00u ? u2f(0x7fffffffu) : Float16::load(h);
}
inline uint16_t float_to_half_rn(float f) {
  return (f2u(f) & 0x7fffffffu) > 0x7f800000u ? uint16_t{0x7fff} : Float16::store(f);
}
}  // namespace mxops::gpu::port
