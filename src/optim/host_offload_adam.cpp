// HostOffloadAdam (torus/optim/host_offload_adam.h): reduce-scatter on the
// device, the norm and Adam on the host, all-gather on the device; its state
// in safetensors files.
#include "torus/optim/host_offload_adam.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "core/log.h"
#include "kernels/cpu/reduce.h"
#include "torus/checkpoint/safetensors.h"
#include "torus/comm/backend.h"
#include "torus/device/device.h"
#include "torus/optim/cpu_adam_kernel.h"

namespace torus::optim {
namespace {

using json = nlohmann::json;

cpu::Dtype kernel_dtype(DType t) {
  switch (t) {
    case DType::kF32: return cpu::Dtype::kF32;
    case DType::kBF16: return cpu::Dtype::kBF16;
    case DType::kF16: return cpu::Dtype::kF16;
    default: break;
  }
  throw InvalidArgument(fmt::format("HostOffloadAdam: parameters of dtype {} (f32, bf16 or f16)", dtype_name(t)));
}

constexpr const char* kFormat = "torus-host-adam-1";
constexpr const char* kManifest = "host_adam.json";
constexpr const char* kStateNames[3] = {"master", "exp_avg", "exp_avg_sq"};

std::string rank_file(int rank) { return fmt::format("host_adam-rank-{:05d}.safetensors", rank); }

// mkdir -p (POSIX: Note [No std::filesystem for trees] in checkpoint/file_io.h).
void make_dirs(const std::string& dir) {
  for (size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      throw ckpt::CheckpointError(fmt::format("HostOffloadAdam: cannot create '{}': {}", part, std::strerror(errno)));
    }
  }
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw ckpt::CheckpointError(fmt::format("HostOffloadAdam: cannot remove '{}': {}", path, std::strerror(errno)));
  }
}

}  // namespace

size_t HostOffloadAdam::padded_numel(size_t numel, int dp_size) {
  TORUS_CHECK(dp_size >= 1, InvalidArgument, "HostOffloadAdam: dp size {} must be >= 1", dp_size);
  size_t d = static_cast<size_t>(dp_size);
  return (numel + d - 1) / d * d;
}

HostOffloadAdam::HostOffloadAdam(comm::Backend& dp, void* params, void* grads, size_t numel, DType dtype,
                                 HostOffloadAdamOptions options)
    : dp_(dp), params_(params), grads_(grads), numel_(numel), dtype_(dtype), options_(std::move(options)) {
  kernel_dtype(dtype);
  const size_t d = static_cast<size_t>(dp.size());
  TORUS_CHECK(numel > 0 && numel % d == 0, InvalidArgument,
              "HostOffloadAdam: {} elements do not split evenly over {} data-parallel ranks; pad the buffers to "
              "padded_numel() = {}",
              numel, d, padded_numel(numel, dp.size()));
  TORUS_CHECK(params != nullptr && grads != nullptr && params != grads, InvalidArgument,
              "HostOffloadAdam: params and grads must be two distinct non-null buffers");
  TORUS_CHECK(dp.supports(comm::OpType::kReduceScatter, dtype, comm::ReduceOp::kSum) &&
                  dp.supports(comm::OpType::kAllGather, dtype) &&
                  dp.supports(comm::OpType::kAllReduce, DType::kF32, comm::ReduceOp::kSum) &&
                  dp.supports(comm::OpType::kAllReduce, DType::kI32, comm::ReduceOp::kMax),
              Unsupported,
              "HostOffloadAdam: the '{}' backend of group '{}' cannot reduce-scatter and all-gather {} and "
              "all-reduce an f32 sum and an i32 max",
              dp.name(), dp.group().name, dtype_name(dtype));
  TORUS_CHECK(options_.max_grad_norm >= 0 && std::isfinite(options_.max_grad_norm), InvalidArgument,
              "HostOffloadAdam: max_grad_norm {} must be finite and >= 0", options_.max_grad_norm);
  shard_ = numel / d;
  offset_ = shard_ * static_cast<size_t>(dp.rank());

  // The shard cut at group boundaries.
  std::vector<HostOffloadAdamGroup> groups = options_.groups;
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < groups.size(); ++i) {
    const HostOffloadAdamGroup& g = groups[i];
    TORUS_CHECK(g.numel > 0 && g.offset <= numel && g.numel <= numel - g.offset, InvalidArgument,
                "HostOffloadAdam: group [{}, +{}) is empty or outside the {} elements", g.offset, g.numel, numel);
    TORUS_CHECK(i == 0 || groups[i - 1].offset + groups[i - 1].numel <= g.offset, InvalidArgument,
                "HostOffloadAdam: groups [{}, +{}) and [{}, +{}) overlap", groups[i - 1].offset,
                groups[i - 1].numel, g.offset, g.numel);
    TORUS_CHECK(g.weight_decay >= 0 && g.lr_scale >= 0, InvalidArgument,
                "HostOffloadAdam: group [{}, +{}) has a negative weight decay or lr scale", g.offset, g.numel);
  }
  size_t at = offset_;
  const size_t stop = offset_ + shard_;
  auto add = [&](size_t b, size_t e, double wd, double lr_scale) {
    if (e > b) segments_.push_back({b - offset_, e - offset_, wd, lr_scale});
  };
  for (const HostOffloadAdamGroup& g : groups) {
    const size_t gb = std::max(g.offset, offset_), ge = std::min(g.offset + g.numel, stop);
    if (gb >= ge) continue;
    add(at, gb, options_.adam.weight_decay, 1.0);
    add(gb, ge, g.weight_decay, g.lr_scale);
    at = ge;
  }
  add(at, stop, options_.adam.weight_decay, 1.0);

  const size_t elt = dtype_size(dtype);
  device::Device& dev = device::get_device(dp.device_type());
  dev_grad_shard_ = dev.allocate(shard_ * elt);
  try {
    dev_param_shard_ = dev.allocate(shard_ * elt);
    dev_scalar_ = dev.allocate(sizeof(float));
  } catch (...) {
    dev.deallocate(dev_grad_shard_);
    dev.deallocate(dev_param_shard_);
    throw;
  }
  try {
    master_.resize(shard_);
    exp_avg_.assign(shard_, 0.0f);
    exp_avg_sq_.assign(shard_, 0.0f);
    const char* shard_start = static_cast<const char*>(params) + offset_ * elt;
    if (dtype == DType::kF32) {
      host_grad32_.resize(shard_);
      host_param32_.resize(shard_);
      dev.copy(master_.data(), shard_start, shard_ * elt);
    } else {
      host_grad16_.resize(shard_);
      host_param16_.resize(shard_);
      dev.copy(host_param16_.data(), shard_start, shard_ * elt);
      kernels::half_to_f32(host_param16_.data(), master_.data(), shard_, dtype);
    }
  } catch (...) {
    dev.deallocate(dev_grad_shard_);
    dev.deallocate(dev_param_shard_);
    dev.deallocate(dev_scalar_);
    throw;
  }
}

HostOffloadAdam::~HostOffloadAdam() {
  device::Device& dev = device::get_device(dp_.device_type());
  dev.deallocate(dev_grad_shard_);
  dev.deallocate(dev_param_shard_);
  dev.deallocate(dev_scalar_);
}

double HostOffloadAdam::grad_sum_squares(const void* host_grad) const {
  double sum = 0;
  if (dtype_ == DType::kF32) {
    const float* g = static_cast<const float*>(host_grad);
    for (size_t i = 0; i < shard_; ++i) sum += static_cast<double>(g[i]) * g[i];
    return sum;
  }
  constexpr size_t kChunk = 1 << 14;
  float buf[kChunk];
  const uint16_t* g = static_cast<const uint16_t*>(host_grad);
  for (size_t i = 0; i < shard_; i += kChunk) {
    const size_t n = std::min(kChunk, shard_ - i);
    kernels::half_to_f32(g + i, buf, n, dtype_);
    for (size_t j = 0; j < n; ++j) sum += static_cast<double>(buf[j]) * buf[j];
  }
  return sum;
}

float HostOffloadAdam::sum_over_dp(float v) {
  device::Device& dev = device::get_device(dp_.device_type());
  dev.copy(dev_scalar_, &v, 4);
  dp_.all_reduce(dev_scalar_, dev_scalar_, 1, DType::kF32, comm::ReduceOp::kSum, options_.timeout)->wait();
  dev.copy(&v, dev_scalar_, 4);
  return v;
}

bool HostOffloadAdam::all_ok(bool ok) {
  device::Device& dev = device::get_device(dp_.device_type());
  int32_t failed = ok ? 0 : 1;
  dev.copy(dev_scalar_, &failed, 4);
  dp_.all_reduce(dev_scalar_, dev_scalar_, 1, DType::kI32, comm::ReduceOp::kMax, options_.timeout)->wait();
  dev.copy(&failed, dev_scalar_, 4);
  return failed == 0;
}

HostOffloadStep HostOffloadAdam::step(float grad_scale) {
  device::Device& dev = device::get_device(dp_.device_type());
  const size_t bytes = shard_ * dtype_size(dtype_);
  const bool f32 = dtype_ == DType::kF32;
  // 1-2: the summed gradient shard, on the host.
  dp_.reduce_scatter(grads_, dev_grad_shard_, shard_, dtype_, comm::ReduceOp::kSum, options_.timeout)->wait();
  void* host_grad = f32 ? static_cast<void*>(host_grad32_.data()) : static_cast<void*>(host_grad16_.data());
  dev.copy(host_grad, dev_grad_shard_, bytes);
  // The norm of the mean gradient times grad_scale, over every rank.
  const double scale = static_cast<double>(grad_scale) / dp_.size();
  // The squared norm of this shard of the mean gradient, scaled before it
  // is narrowed to f32 (the loss-scaled sum would overflow f32 first).
  const float total = sum_over_dp(static_cast<float>(grad_sum_squares(host_grad) * scale * scale));
  HostOffloadStep out;
  out.grad_norm = std::sqrt(static_cast<double>(total));
  if (!std::isfinite(out.grad_norm)) {
    out.skipped = true;
    TORUS_LOG_WARN("HostOffloadAdam: the gradient norm is {} at step {}: the update is skipped", out.grad_norm,
                   steps_ + 1);
    return out;
  }
  if (options_.max_grad_norm > 0) out.clip_coef = std::min(1.0, options_.max_grad_norm / (out.grad_norm + 1e-6));
  // 3: Adam on the master shard, the mean gradient, the rounded write-back.
  void* host_param = f32 ? static_cast<void*>(host_param32_.data()) : static_cast<void*>(host_param16_.data());
  const size_t elt = dtype_size(dtype_);
  std::vector<cpu::AdamHyper> hypers;
  std::vector<cpu::AdamSlice> slices;
  for (const Segment& seg : segments_) {
    cpu::AdamHyper h = options_.adam;
    h.step = steps_ + 1;
    h.found_inf = nullptr;
    h.grad_scale = static_cast<float>(scale * out.clip_coef);
    h.weight_decay = seg.weight_decay;
    h.lr = options_.adam.lr * seg.lr_scale;
    cpu::AdamSlice sl;
    sl.param = master_.data() + seg.begin;
    sl.grad = static_cast<const char*>(host_grad) + seg.begin * elt;
    sl.grad_dtype = kernel_dtype(dtype_);
    sl.exp_avg = exp_avg_.data() + seg.begin;
    sl.exp_avg_sq = exp_avg_sq_.data() + seg.begin;
    sl.param_out = static_cast<char*>(host_param) + seg.begin * elt;
    sl.out_dtype = kernel_dtype(dtype_);
    sl.numel = static_cast<int64_t>(seg.end - seg.begin);
    hypers.push_back(h);
    slices.push_back(sl);
  }
  cpu::adam_update(hypers, slices, options_.threads);
  ++steps_;
  // 4: every rank's updated shard, everywhere.
  dev.copy(dev_param_shard_, host_param, bytes);
  dp_.all_gather(dev_param_shard_, params_, shard_, dtype_, options_.timeout)->wait();
  return out;
}

void HostOffloadAdam::publish_params() {
  device::Device& dev = device::get_device(dp_.device_type());
  const size_t bytes = shard_ * dtype_size(dtype_);
  void* host_param;
  if (dtype_ == DType::kF32) {
    std::copy(master_.begin(), master_.end(), host_param32_.begin());
    host_param = host_param32_.data();
  } else {
    kernels::f32_to_half(master_.data(), host_param16_.data(), shard_, dtype_);
    host_param = host_param16_.data();
  }
  std::string error;
  try {
    dev.copy(dev_param_shard_, host_param, bytes);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!all_ok(error.empty())) {
    throw ckpt::CheckpointError(fmt::format("HostOffloadAdam: writing the loaded parameters to the device failed{}",
                                            error.empty() ? " on another rank" : ": " + error));
  }
  dp_.all_gather(dev_param_shard_, params_, shard_, dtype_, options_.timeout)->wait();
}

// Note [Host optimizer state files]: every rank writes its file under a
// temporary name and renames it into place; the ranks agree (an i32 max over
// dp) that all of them succeeded, gather the files' SHA-256s, and only then
// does rank 0 write host_adam.json — after removing any earlier one first,
// so a directory holds either a complete state or no manifest at all.
void HostOffloadAdam::save(const std::string& dir) {
  const int rank = dp_.rank(), size = dp_.size();
  device::Device& dev = device::get_device(dp_.device_type());
  auto fail = [&](const std::string& error, const char* stage) {
    return ckpt::CheckpointError(
        error.empty() ? fmt::format("HostOffloadAdam: {} in '{}' failed on another rank of group '{}'", stage, dir,
                                    dp_.group().name)
                      : fmt::format("HostOffloadAdam: {} in '{}' failed on rank {}: {}", stage, dir, rank, error));
  };
  std::string error;
  try {
    make_dirs(dir);
    if (rank == 0) remove_file(dir + "/" + kManifest);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Nobody writes a rank file before the old manifest is gone.
  if (!all_ok(error.empty())) throw fail(error, "removing the old manifest");
  // This rank's file, and its checksum on the device for the gather.
  constexpr size_t kSha = 64;
  device::DeviceBuffer mine, all;
  try {
    std::vector<ckpt::TensorEntry> entries;
    uint64_t at = 0;
    for (const char* name : kStateNames) {
      entries.push_back({name, "F32", {static_cast<int64_t>(shard_)}, at, at + shard_ * sizeof(float)});
      at += shard_ * sizeof(float);
    }
    const std::map<std::string, std::string> meta = {{"format", kFormat},
                                                     {"numel", std::to_string(numel_)},
                                                     {"offset", std::to_string(offset_)},
                                                     {"dp_size", std::to_string(size)},
                                                     {"steps", std::to_string(steps_)},
                                                     {"dtype", std::string(dtype_name(dtype_))}};
    const std::string path = dir + "/" + rank_file(rank);
    const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
    remove_file(tmp);
    std::string sha;
    try {
      ckpt::FileWriter w(tmp);
      const std::vector<uint8_t> header = ckpt::encode_header(entries, meta);
      w.write(header.data(), header.size());
      w.write(master_.data(), shard_ * sizeof(float));
      w.write(exp_avg_.data(), shard_ * sizeof(float));
      w.write(exp_avg_sq_.data(), shard_ * sizeof(float));
      sha = w.close();
      ckpt::rename_durable(tmp, path);
    } catch (...) {
      ::unlink(tmp.c_str());  // best effort: the partial file is never named by a manifest
      throw;
    }
    sha.resize(kSha, ' ');
    mine = device::DeviceBuffer(dp_.device_type(), kSha);
    all = device::DeviceBuffer(dp_.device_type(), kSha * static_cast<size_t>(size));
    dev.copy(mine.data(), sha.data(), kSha);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!all_ok(error.empty())) throw fail(error, "writing the rank files");
  dp_.all_gather(mine.data(), all.data(), kSha, DType::kU8, options_.timeout)->wait();
  if (rank == 0) {
    try {
      std::string shas(kSha * static_cast<size_t>(size), ' ');
      dev.copy(shas.data(), all.data(), shas.size());
      json m;
      m["format"] = kFormat;
      m["numel"] = numel_;
      m["dtype"] = std::string(dtype_name(dtype_));
      m["dp_size"] = size;
      m["steps"] = steps_;
      m["files"] = json::array();
      for (int r = 0; r < size; ++r) {
        m["files"].push_back({{"name", rank_file(r)},
                              {"offset", shard_ * static_cast<size_t>(r)},
                              {"numel", shard_},
                              {"sha256", shas.substr(kSha * static_cast<size_t>(r), kSha)}});
      }
      const std::string path = dir + "/" + kManifest;
      const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
      remove_file(tmp);
      ckpt::write_file(tmp, m.dump(1) + "\n");
      ckpt::rename_durable(tmp, path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!all_ok(error.empty())) throw fail(error, std::string("writing ").append(kManifest).c_str());
}

void HostOffloadAdam::load(const std::string& dir) {
  std::vector<float> master, exp_avg, exp_avg_sq;
  int64_t steps = 0;
  std::string error;
  try {
    master.resize(shard_);
    exp_avg.resize(shard_);
    exp_avg_sq.resize(shard_);
    const std::string manifest_path = dir + "/" + kManifest;
    ckpt::MappedFile mf(manifest_path);
    json m;
    try {
      m = json::parse(std::string_view(reinterpret_cast<const char*>(mf.data()), mf.size()));
    } catch (const json::exception& e) {
      throw ckpt::CheckpointError(fmt::format("'{}' is not valid JSON: {}", manifest_path, e.what()));
    }
    auto bad = [&](const std::string& why) {
      return ckpt::CheckpointError(fmt::format("'{}': {}", manifest_path, why));
    };
    // Every key is looked up with contains()/at() (nothing read from the file
    // is trusted: a missing key is an error, never undefined behaviour).
    auto has = [](const json& o, const char* key, bool (json::*is)() const noexcept) {
      return o.is_object() && o.contains(key) && (o.at(key).*is)();
    };
    if (!has(m, "format", &json::is_string) || m.at("format").get<std::string>() != kFormat) {
      throw bad(fmt::format("not a {} manifest", kFormat));
    }
    if (!has(m, "numel", &json::is_number_unsigned) || m.at("numel").get<uint64_t>() != numel_) {
      throw bad(fmt::format("holds {} elements, this optimizer has {}",
                            m.contains("numel") ? m.at("numel").dump() : "no", numel_));
    }
    if (!has(m, "dtype", &json::is_string) || m.at("dtype").get<std::string>() != std::string(dtype_name(dtype_))) {
      throw bad(fmt::format("was saved for {} parameters, these are {}",
                            m.contains("dtype") ? m.at("dtype").dump() : "unknown", dtype_name(dtype_)));
    }
    if (!has(m, "steps", &json::is_number_integer) || m.at("steps").get<int64_t>() < 0) {
      throw bad("steps is not a count");
    }
    steps = m.at("steps").get<int64_t>();
    if (!has(m, "files", &json::is_array) || m.at("files").empty()) throw bad("names no files");
    // The files must tile [0, numel) in order.
    size_t covered = 0, filled = 0;
    for (const json& f : m.at("files")) {
      if (!has(f, "name", &json::is_string) || !has(f, "offset", &json::is_number_unsigned) ||
          !has(f, "numel", &json::is_number_unsigned) || !has(f, "sha256", &json::is_string)) {
        throw bad("a file entry lacks name, offset, numel or sha256");
      }
      const std::string name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
        throw bad(fmt::format("file name '{}' is not a plain name", name));
      }
      const size_t off = f.at("offset").get<size_t>(), n = f.at("numel").get<size_t>();
      if (off != covered || n > numel_ - covered) throw bad("the files do not cover the elements once, in order");
      covered += n;
      const size_t lo = std::max(off, offset_), hi = std::min(off + n, offset_ + shard_);
      if (lo >= hi) continue;  // none of this rank's elements
      const std::string path = dir + "/" + name;
      const std::string want = f.at("sha256").get<std::string>();
      const std::string got = ckpt::sha256_file(path);
      if (got != want) throw bad(fmt::format("'{}' has SHA-256 {}, the manifest says {}", path, got, want));
      ckpt::MappedFile file(path);
      const ckpt::Header h = ckpt::parse_header(std::span<const uint8_t>(file.data(), file.size()), file.size(), path);
      float* into[3] = {master.data(), exp_avg.data(), exp_avg_sq.data()};
      for (int k = 0; k < 3; ++k) {
        const ckpt::TensorEntry* e = h.find(kStateNames[k]);
        if (e == nullptr || e->dtype != "F32" || e->shape != std::vector<int64_t>{static_cast<int64_t>(n)}) {
          throw ckpt::CheckpointError(fmt::format("'{}' lacks an f32 '{}' of {} elements", path, kStateNames[k], n));
        }
        std::memcpy(into[k] + (lo - offset_), file.data() + h.data_offset + e->begin + (lo - off) * sizeof(float),
                    (hi - lo) * sizeof(float));
      }
      filled += hi - lo;
    }
    if (covered != numel_ || filled != shard_) {
      throw bad(fmt::format("the files cover {} of {} elements", covered, numel_));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Nothing changes unless every rank could read its part.
  if (!all_ok(error.empty())) {
    throw ckpt::CheckpointError(
        error.empty() ? fmt::format("HostOffloadAdam: loading '{}' failed on another rank of group '{}'", dir,
                                    dp_.group().name)
                      : fmt::format("HostOffloadAdam: loading '{}' failed on rank {}: {}", dir, dp_.rank(), error));
  }
  master_ = std::move(master);
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
  steps_ = steps;
  publish_params();
}

}  // namespace torus::optim
