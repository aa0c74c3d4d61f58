// torus_kernel_bandwidth — achieved memory bandwidth of each CUDA kernel, as
// a fraction of the GPU's memory bandwidth.
//
// First it verifies each kernel on a small problem against its CPU reference
// (and refuses to report numbers if one disagrees). Then, per kernel, it runs
// 3 warm-up and 20 timed iterations on buffers far larger than the caches,
// times each with CUDA events and reports the median. Bytes counted are the
// bytes each kernel must move (reads + writes, e.g. 28 per parameter for AdamW
// with bf16 gradients and a bf16 model copy). Two references: the theoretical
// peak from the memory clock and bus width, and a device-to-device copy
// measured the same way (read + write), the practical ceiling.
//
// Usage: torus_kernel_bandwidth [--scale S]   (S multiplies the problem sizes; default 1)
// Exit status: 0 on success, 1 on a verification failure or missing GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/unscale.h"
#include "kernels/ref/adamw_ref.h"
#include "kernels/ref/cast_ref.h"
#include "kernels/ref/half.h"
#include "kernels/ref/unscale_ref.h"
#include "torus/device/device.h"

namespace {

using torus::DType;
using torus::device::Device;
using torus::device::DeviceBuffer;
using namespace torus::kernels;

Device& gpu() { return torus::device::get_device(torus::DeviceType::kCUDA); }

// Median milliseconds of one call of `fn` on the default stream.
double time_ms(const std::function<void()>& fn) {
  Device& d = gpu();
  auto stream = d.default_stream(d.current());
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    auto start = d.create_event({.timing = true});
    auto end = d.create_event({.timing = true});
    start.record(stream);
    fn();
    end.record(stream);
    end.synchronize();
    ms.push_back(end.elapsed_ms(start));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string kernel;
  double elements;
  double bytes;
  double ms;
};

// --- verification on small problems --------------------------------------------

bool verify_adamw() {
  const size_t n = 100003;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> p(n), m(n), v(n), gf(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = nd(rng);
    m[i] = 0.1f * nd(rng);
    v[i] = 0.01f * std::fabs(nd(rng));
    gf[i] = nd(rng);
  }
  std::vector<uint16_t> g(n), w(n, 0);
  for (size_t i = 0; i < n; ++i) g[i] = ref::f32_to_bf16(gf[i]);
  DeviceBuffer dp(torus::DeviceType::kCUDA, n * 4), dm(torus::DeviceType::kCUDA, n * 4),
      dv(torus::DeviceType::kCUDA, n * 4), dg(torus::DeviceType::kCUDA, n * 2), dw(torus::DeviceType::kCUDA, n * 2);
  gpu().copy(dp.data(), p.data(), n * 4);
  gpu().copy(dm.data(), m.data(), n * 4);
  gpu().copy(dv.data(), v.data(), n * 4);
  gpu().copy(dg.data(), g.data(), n * 2);
  AdamWConfig cfg;
  AdamWTensor h{p.data(), g.data(), m.data(), v.data(), w.data(), n};
  AdamWTensor d{dp.as<float>(), dg.data(), dm.as<float>(), dv.as<float>(), dw.data(), n};
  adamw_step_ref({&h, 1}, DType::kBF16, DType::kBF16, cfg);
  cuda::adamw_step({&d, 1}, DType::kBF16, DType::kBF16, cfg, nullptr, nullptr);
  std::vector<float> gp(n);
  std::vector<uint16_t> gw(n);
  gpu().copy(gp.data(), dp.data(), n * 4);
  gpu().copy(gw.data(), dw.data(), n * 2);
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(gp[i] - p[i]) > 1e-6f + 1e-5f * std::fabs(p[i]) || std::abs(int(gw[i]) - int(w[i])) > 1) {
      std::printf("VERIFY FAILED: adamw element %zu: gpu %.9g ref %.9g\n", i, gp[i], p[i]);
      return false;
    }
  }
  return true;
}

bool verify_unscale_and_cast() {
  const size_t n = 100003;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 10.0f);
  std::vector<float> x(n);
  for (float& f : x) f = nd(rng);
  std::vector<uint16_t> h(n), h_ref(n);
  DeviceBuffer dx(torus::DeviceType::kCUDA, n * 4), dh(torus::DeviceType::kCUDA, n * 2),
      found(torus::DeviceType::kCUDA, 4);
  gpu().copy(dx.data(), x.data(), n * 4);
  cuda::cast(dx.data(), DType::kF32, dh.data(), DType::kBF16, n, nullptr);
  cast_ref(x.data(), DType::kF32, h_ref.data(), DType::kBF16, n);
  gpu().copy(h.data(), dh.data(), n * 2);
  if (h != h_ref) {
    std::printf("VERIFY FAILED: cast f32->bf16\n");
    return false;
  }
  gpu().fill_async(found.data(), 0, 4, gpu().default_stream(gpu().current()));
  GradTensor gd{dh.data(), n};
  GradTensor gh{h_ref.data(), n};
  float found_ref = 0.0f;
  cuda::unscale_grads({&gd, 1}, DType::kBF16, 0.125f, found.as<float>(), nullptr);
  unscale_grads_ref({&gh, 1}, DType::kBF16, 0.125f, &found_ref);
  float found_gpu = -1.0f;
  gpu().copy(&found_gpu, found.data(), 4);
  gpu().copy(h.data(), dh.data(), n * 2);
  if (h != h_ref || found_gpu != found_ref) {
    std::printf("VERIFY FAILED: unscale bf16\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double scale = 1.0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--scale") == 0) scale = std::atof(argv[i + 1]);
  }
  Device& d = gpu();
  if (d.count() == 0) {
    std::printf("torus_kernel_bandwidth: %s\n", d.describe().c_str());
    return 1;
  }
  d.set_current(0);
  torus::device::DeviceProperties prop = d.properties(0);
  std::printf("device: %s, %d SMs, %.1f GiB, peak memory bandwidth %.0f GB/s (from clock and bus width)\n",
              prop.name.c_str(), prop.multiprocessors, prop.total_memory / double(1 << 30),
              prop.peak_memory_bandwidth / 1e9);
  if (!verify_adamw() || !verify_unscale_and_cast()) return 1;
  std::printf("verified: adamw (bf16 grad, bf16 model), cast f32->bf16, unscale bf16 against the CPU references\n\n");

  std::vector<Row> rows;
  const auto big = static_cast<size_t>(256.0 * (1 << 20) * scale);  // elements per large buffer

  {  // device-to-device copy: the practical ceiling
    size_t bytes = big * 4;
    DeviceBuffer a(torus::DeviceType::kCUDA, bytes), b(torus::DeviceType::kCUDA, bytes);
    auto s = d.default_stream(0);
    d.fill_async(a.data(), 1, bytes, s);
    double ms = time_ms([&] { d.copy_async(b.data(), a.data(), bytes, s); });
    rows.push_back({"memcpy d2d", double(big), 2.0 * bytes, ms});
  }
  auto adamw_case = [&](DType grad_t, DType model_t, const char* name) {
    const int tensors = 8;
    const size_t per = big / tensors;
    const size_t gsz = torus::dtype_size(grad_t);
    const bool model = model_t != DType::kF32;
    std::vector<DeviceBuffer> bufs;
    std::vector<AdamWTensor> ts;
    auto s = d.default_stream(0);
    for (int k = 0; k < tensors; ++k) {
      DeviceBuffer p(torus::DeviceType::kCUDA, per * 4), m(torus::DeviceType::kCUDA, per * 4),
          v(torus::DeviceType::kCUDA, per * 4), g(torus::DeviceType::kCUDA, per * gsz),
          w(torus::DeviceType::kCUDA, model ? per * 2 : 0);
      d.fill_async(p.data(), 0x3c, per * 4, s);  // 0.0115 everywhere: finite values
      d.fill_async(m.data(), 0, per * 4, s);
      d.fill_async(v.data(), 0, per * 4, s);
      d.fill_async(g.data(), 0x3c, per * gsz, s);
      ts.push_back({p.as<float>(), g.data(), m.as<float>(), v.as<float>(), model ? w.data() : nullptr, per});
      for (DeviceBuffer* b : {&p, &m, &v, &g, &w}) bufs.push_back(std::move(*b));
    }
    AdamWConfig cfg;
    double ms = time_ms([&] { cuda::adamw_step(ts, grad_t, model_t, cfg, nullptr, nullptr); });
    // p, m, v read and written (24 bytes), the gradient read, the model copy written.
    double bytes_per = 24.0 + static_cast<double>(gsz) + (model ? 2.0 : 0.0);
    rows.push_back({name, double(per * tensors), bytes_per * double(per * tensors), ms});
  };
  adamw_case(DType::kBF16, DType::kBF16, "adamw bf16 grad -> bf16 model");
  adamw_case(DType::kF32, DType::kF32, "adamw f32 grad, no model copy");
  {
    size_t n = big * 2;
    DeviceBuffer g(torus::DeviceType::kCUDA, n * 2), found(torus::DeviceType::kCUDA, 4);
    auto s = d.default_stream(0);
    d.fill_async(g.data(), 0x3c, n * 2, s);
    d.fill_async(found.data(), 0, 4, s);
    GradTensor t{g.data(), n};
    double ms = time_ms([&] { cuda::unscale_grads({&t, 1}, DType::kBF16, 1.0f, found.as<float>(), nullptr); });
    rows.push_back({"unscale bf16 (in place)", double(n), 4.0 * n, ms});
  }
  {
    size_t n = big;
    DeviceBuffer f(torus::DeviceType::kCUDA, n * 4), h(torus::DeviceType::kCUDA, n * 2);
    auto s = d.default_stream(0);
    d.fill_async(f.data(), 0x3c, n * 4, s);
    double ms = time_ms([&] { cuda::cast(f.data(), DType::kF32, h.data(), DType::kBF16, n, nullptr); });
    rows.push_back({"cast f32 -> bf16", double(n), 6.0 * n, ms});
    ms = time_ms([&] { cuda::cast(h.data(), DType::kBF16, f.data(), DType::kF32, n, nullptr); });
    rows.push_back({"cast bf16 -> f32", double(n), 6.0 * n, ms});
    ms = time_ms([&] { cuda::cast(f.data(), DType::kF32, h.data(), DType::kF16, n, nullptr); });
    rows.push_back({"cast f32 -> f16", double(n), 6.0 * n, ms});
  }

  const double peak = prop.peak_memory_bandwidth;
  const double copy_bw = rows[0].bytes / (rows[0].ms * 1e-3);
  std::printf("%-32s %12s %10s %10s %10s %8s %8s\n", "kernel", "elements", "MB/iter", "ms", "GB/s", "%peak",
              "%copy");
  for (const Row& r : rows) {
    double bw = r.bytes / (r.ms * 1e-3);
    std::printf("%-32s %12.0f %10.1f %10.3f %10.1f %7.1f%% %7.1f%%\n", r.kernel.c_str(), r.elements, r.bytes / 1e6,
                r.ms, bw / 1e9, peak > 0 ? 100.0 * bw / peak : 0.0, 100.0 * bw / copy_bw);
  }
  double adamw_bw = rows[1].bytes / (rows[1].ms * 1e-3);
  std::printf("\nfused AdamW (bf16): %.1f%% of peak memory bandwidth, %.1f%% of measured copy bandwidth (goal: >= 80%% "
              "of peak)\n",
              peak > 0 ? 100.0 * adamw_bw / peak : 0.0, 100.0 * adamw_bw / copy_bw);
  return 0;
}
