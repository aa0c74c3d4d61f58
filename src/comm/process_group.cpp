// The tensor-level process group (process_group.h): validation, keep-alive,
// debug fingerprints, and dispatch to the backend of the tensors' device.
#include "torus/comm/process_group.h"

#include <ATen/Functions.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cctype>
#include <numeric>
#include <optional>
#include <set>

#include "core/log.h"
#include "torus/comm/shared_host.h"
#include "torus/core/params.h"
#include "torus/device/device.h"

namespace torus::comm {
namespace {

std::string shape_string(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

void check_tensor(const at::Tensor& t, const char* what, OpType op, const GroupInfo& g) {
  TORUS_CHECK(t.defined(), InvalidArgument, "{} on group '{}': {} tensor is undefined", op_type_name(op), g.name, what);
  TORUS_CHECK(t.is_contiguous(), InvalidArgument,
              "{} on group '{}': {} tensor (shape {}, strides [{}]) is not contiguous; call .contiguous() first",
              op_type_name(op), g.name, what, shape_string(t), fmt::join(t.strides(), ", "));
  TORUS_CHECK(!t.is_sparse(), InvalidArgument, "{} on group '{}': {} tensor is sparse", op_type_name(op), g.name,
              what);
  to_dtype(t.scalar_type());  // throws for unsupported dtypes
}

void check_pair(const at::Tensor& a, const at::Tensor& b, OpType op, const GroupInfo& g) {
  TORUS_CHECK(a.scalar_type() == b.scalar_type(), InvalidArgument,
              "{} on group '{}': input dtype {} differs from output dtype {}", op_type_name(op), g.name,
              scalar_type_name(a.scalar_type()), scalar_type_name(b.scalar_type()));
  TORUS_CHECK(a.device() == b.device(), InvalidArgument, "{} on group '{}': input on {} but output on {}",
              op_type_name(op), g.name, a.device().str(), b.device().str());
}

void check_rank(int r, int size, const char* what, OpType op, const GroupInfo& g) {
  TORUS_CHECK(r >= 0 && r < size, InvalidArgument, "{} on group '{}': {} {} is outside the group of {} ranks",
              op_type_name(op), g.name, what, r, size);
}

// Note [Stream order]: for a device tensor the op is ordered after the work
// already queued on LibTorch's current stream of that device: the device
// backend reads the calling thread's current stream, which this guard sets
// from LibTorch's for the duration of the call. A no-op for CPU tensors.
class CallerStream {
 public:
  explicit CallerStream(const at::Tensor& t) {
    if (t.defined() && t.device().is_cuda() && device::registered(DeviceType::kCUDA)) {
      c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device());
      guard_.emplace(device::Stream::borrow(DeviceType::kCUDA, t.device().index(), s.native_handle()));
    }
  }

 private:
  std::optional<device::StreamGuard> guard_;
};

// Keeps the op's tensors alive until it completes (Note [Work lifetime]).
WorkPtr hold(WorkPtr work, std::initializer_list<at::Tensor> tensors) {
  work->keep_alive(std::make_shared<std::vector<at::Tensor>>(tensors));
  return work;
}

}  // namespace

DType to_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return DType::kF32;
    case c10::ScalarType::Double: return DType::kF64;
    case c10::ScalarType::Half: return DType::kF16;
    case c10::ScalarType::BFloat16: return DType::kBF16;
    case c10::ScalarType::Int: return DType::kI32;
    case c10::ScalarType::Long: return DType::kI64;
    case c10::ScalarType::Byte: return DType::kU8;
    default:
      throw InvalidArgument(fmt::format("dtype {} is not supported by Torus collectives (use f32, f64, f16, bf16, "
                                        "i32, i64 or u8)",
                                        scalar_type_name(t)));
  }
}

std::string scalar_type_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "f32";
    case c10::ScalarType::Double: return "f64";
    case c10::ScalarType::Half: return "f16";
    case c10::ScalarType::BFloat16: return "bf16";
    case c10::ScalarType::Int: return "i32";
    case c10::ScalarType::Long: return "i64";
    case c10::ScalarType::Byte: return "u8";
    case c10::ScalarType::Char: return "i8";
    case c10::ScalarType::Short: return "i16";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexHalf: return "c32";
    case c10::ScalarType::ComplexFloat: return "c64";
    case c10::ScalarType::ComplexDouble: return "c128";
    default: {
      // f8 variants, quantized and bit types: c10's own spelling, lower case.
      std::string name = c10::toString(t);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
      return name;
    }
  }
}

c10::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::kF32: return c10::ScalarType::Float;
    case DType::kF64: return c10::ScalarType::Double;
    case DType::kF16: return c10::ScalarType::Half;
    case DType::kBF16: return c10::ScalarType::BFloat16;
    case DType::kI32: return c10::ScalarType::Int;
    case DType::kI64: return c10::ScalarType::Long;
    case DType::kU8: return c10::ScalarType::Byte;
  }
  return c10::ScalarType::Undefined;
}

ProcessGroup::ProcessGroup(std::shared_ptr<Context> context, BackendPtr host, BackendPtr device)
    : context_(std::move(context)), host_(std::move(host)), device_(std::move(device)) {
  TORUS_CHECK(host_ != nullptr, InvalidArgument, "ProcessGroup needs a host backend");
  timeout_ = context_ ? context_->default_timeout() : env_params().timeout;
  debug_ = env_params().debug_collectives;
}

int ProcessGroup::global_rank(int group_rank) const {
  const auto& g = info();
  TORUS_CHECK(group_rank >= 0 && group_rank < g.size, InvalidArgument, "rank {} outside group '{}' of {} ranks",
              group_rank, g.name, g.size);
  return g.global_ranks.empty() ? group_rank : g.global_ranks[group_rank];
}

void ProcessGroup::set_timeout(Duration timeout) {
  TORUS_CHECK(timeout.count() > 0, InvalidArgument, "group timeout must be > 0 ms, got {}", timeout.count());
  timeout_ = timeout;
}

const BackendPtr& ProcessGroup::backend_for(const at::Tensor& t, const char* what) const {
  if (t.device().is_cpu()) return host_;
  TORUS_CHECK(device_ != nullptr && t.device().is_cuda(), InvalidArgument,
              "group '{}' has no backend for {} tensors on {} (this build's device backend: {})", name(), what,
              t.device().str(), device_ ? std::string(device_->name()) : std::string("none"));
  return device_;
}

void ProcessGroup::check_fingerprint(const BackendPtr& b, OpType op, const at::Tensor& t,
                                     const std::vector<int64_t>& extra, Duration timeout) {
  if (!debug_ || b->size() == 1) return;
  // Fixed-size fingerprint: magic, op, dtype, numel, then op-specific values.
  constexpr size_t kLen = 8;
  std::vector<int64_t> mine(kLen, -1);
  mine[0] = 0x746f727573;  // "torus"
  mine[1] = static_cast<int64_t>(op);
  mine[2] = t.defined() ? static_cast<int64_t>(to_dtype(t.scalar_type())) : -1;
  mine[3] = t.defined() ? t.numel() : -1;
  for (size_t i = 0; i < extra.size() && 4 + i < kLen; ++i) mine[4 + i] = extra[i];
  std::vector<int64_t> all(kLen * static_cast<size_t>(b->size()));
  b->all_gather(mine.data(), all.data(), kLen, DType::kI64, timeout)->wait();
  auto describe = [](const int64_t* fp) {
    if (fp[0] != 0x746f727573) return std::string("a corrupt fingerprint");
    return fmt::format("{}(dtype {}, numel {}, args [{}, {}, {}, {}])",
                       op_type_name(static_cast<OpType>(fp[1])),
                       fp[2] >= 0 ? dtype_name(static_cast<DType>(fp[2])) : "none", fp[3], fp[4], fp[5], fp[6], fp[7]);
  };
  // The odd rank out is named against what most ranks called (rank 0's
  // call on a tie), so that a wrong rank 0 is the one named.
  const int n = b->size();
  auto fp = [&](int r) { return all.data() + kLen * static_cast<size_t>(r); };
  int majority = 0, votes = 0;
  for (int r = 0; r < n; ++r) {
    int same = 0;
    for (int q = 0; q < n; ++q) same += std::equal(fp(q), fp(q) + kLen, fp(r)) ? 1 : 0;
    if (same > votes) majority = r, votes = same;
  }
  if (votes == n) return;
  std::vector<int> odd;
  for (int r = 0; r < n; ++r) {
    if (!std::equal(fp(r), fp(r) + kLen, fp(majority))) odd.push_back(r);
  }
  throw InvalidArgument(fmt::format(
      "collective mismatch on group '{}' (TORUS_DEBUG_COLLECTIVES): rank {} called {} but {} ranks (rank {} among "
      "them) called {}{} (this is rank {})",
      name(), odd.front(), describe(fp(odd.front())), votes, majority, describe(fp(majority)),
      odd.size() > 1 ? fmt::format("; ranks [{}] differ from them", fmt::join(odd, ", ")) : std::string(), rank()));
}

WorkPtr ProcessGroup::all_reduce(at::Tensor& tensor, const AllReduceOptions& opts) {
  return all_reduce(tensor, tensor, opts);
}

WorkPtr ProcessGroup::all_reduce(const at::Tensor& input, at::Tensor& output, const AllReduceOptions& opts) {
  const auto op = OpType::kAllReduce;
  check_tensor(input, "input", op, info());
  check_tensor(output, "output", op, info());
  check_pair(input, output, op, info());
  TORUS_CHECK(input.numel() == output.numel(), InvalidArgument,
              "all_reduce on group '{}': input has {} elements, output {}", name(), input.numel(), output.numel());
  const auto& b = backend_for(input, "input");
  CallerStream caller_stream(input);
  Duration timeout = resolve(opts.timeout);
  check_fingerprint(b, op, input, {static_cast<int64_t>(opts.op)}, timeout);
  return hold(b->all_reduce(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                            to_dtype(input.scalar_type()), opts.op, timeout),
              {input, output});
}

WorkPtr ProcessGroup::reduce_scatter(const at::Tensor& input, at::Tensor& output, const ReduceScatterOptions& opts) {
  const auto op = OpType::kReduceScatter;
  check_tensor(input, "input", op, info());
  check_tensor(output, "output", op, info());
  check_pair(input, output, op, info());
  TORUS_CHECK(input.numel() == output.numel() * size(), InvalidArgument,
              "reduce_scatter on group '{}': input must hold size ({}) x output ({} elements) = {} elements, has {}",
              name(), size(), output.numel(), output.numel() * size(), input.numel());
  const auto& b = backend_for(input, "input");
  CallerStream caller_stream(input);
  Duration timeout = resolve(opts.timeout);
  check_fingerprint(b, op, input, {static_cast<int64_t>(opts.op)}, timeout);
  return hold(b->reduce_scatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                                to_dtype(input.scalar_type()), opts.op, timeout),
              {input, output});
}

WorkPtr ProcessGroup::all_gather(const at::Tensor& input, at::Tensor& output, const AllGatherOptions& opts) {
  const auto op = OpType::kAllGather;
  check_tensor(input, "input", op, info());
  check_tensor(output, "output", op, info());
  check_pair(input, output, op, info());
  TORUS_CHECK(output.numel() == input.numel() * size(), InvalidArgument,
              "all_gather on group '{}': output must hold size ({}) x input ({} elements) = {} elements, has {}",
              name(), size(), input.numel(), input.numel() * size(), output.numel());
  const auto& b = backend_for(input, "input");
  CallerStream caller_stream(input);
  Duration timeout = resolve(opts.timeout);
  check_fingerprint(b, op, input, {}, timeout);
  return hold(b->all_gather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                            to_dtype(input.scalar_type()), timeout),
              {input, output});
}

WorkPtr ProcessGroup::all_to_all(const at::Tensor& input, at::Tensor& output, const AllToAllOptions& opts) {
  const auto op = OpType::kAllToAll;
  check_tensor(input, "input", op, info());
  check_tensor(output, "output", op, info());
  check_pair(input, output, op, info());
  TORUS_CHECK(input.dim() >= 1 && output.dim() >= 1, InvalidArgument,
              "all_to_all on group '{}': tensors need at least one dimension", name());
  TORUS_CHECK(input.data_ptr() != output.data_ptr() || input.numel() == 0, InvalidArgument,
              "all_to_all on group '{}': input and output must not alias", name());
  const int n = size();
  const int64_t in_row = input.size(0) ? input.numel() / input.size(0) : 0;
  const int64_t out_row = output.size(0) ? output.numel() / output.size(0) : 0;
  std::vector<size_t> send(n), recv(n);
  auto fill = [&](const std::vector<int64_t>& splits, int64_t rows, int64_t row_elems, std::vector<size_t>& counts,
                  const char* which) {
    if (splits.empty()) {
      TORUS_CHECK(rows % n == 0, InvalidArgument,
                  "all_to_all on group '{}': {} dim 0 ({}) is not divisible by the group size {}; pass split sizes",
                  name(), which, rows, n);
      std::fill(counts.begin(), counts.end(), static_cast<size_t>(rows / n * row_elems));
      return;
    }
    TORUS_CHECK(static_cast<int>(splits.size()) == n, InvalidArgument,
                "all_to_all on group '{}': {} split sizes has {} entries, the group has {} ranks", name(), which,
                splits.size(), n);
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      TORUS_CHECK(splits[r] >= 0, InvalidArgument, "all_to_all on group '{}': negative {} split size {} for rank {}",
                  name(), which, splits[r], r);
      counts[r] = static_cast<size_t>(splits[r] * row_elems);
      total += splits[r];
    }
    TORUS_CHECK(total == rows, InvalidArgument, "all_to_all on group '{}': {} split sizes sum to {}, dim 0 is {}",
                name(), which, total, rows);
  };
  fill(opts.input_split_sizes, input.size(0), in_row, send, "input");
  fill(opts.output_split_sizes, output.size(0), out_row, recv, "output");
  TORUS_CHECK(input.size(0) == 0 || output.size(0) == 0 || in_row == out_row, InvalidArgument,
              "all_to_all on group '{}': input rows have {} elements, output rows {}", name(), in_row, out_row);
  const auto& b = backend_for(input, "input");
  CallerStream caller_stream(input);
  Duration timeout = resolve(opts.timeout);
  check_fingerprint(b, op, at::Tensor(), {static_cast<int64_t>(to_dtype(input.scalar_type())), in_row}, timeout);
  return hold(b->all_to_all(input.data_ptr(), output.data_ptr(), send, recv, to_dtype(input.scalar_type()), timeout),
              {input, output});
}

WorkPtr ProcessGroup::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  const auto op = OpType::kBroadcast;
  check_tensor(tensor, "the", op, info());
  check_rank(opts.root, size(), "root", op, info());
  const auto& b = backend_for(tensor, "the");
  CallerStream caller_stream(tensor);
  Duration timeout = resolve(opts.timeout);
  check_fingerprint(b, op, tensor, {opts.root}, timeout);
  return hold(b->broadcast(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), to_dtype(tensor.scalar_type()),
                           opts.root, timeout),
              {tensor});
}

WorkPtr ProcessGroup::reduce(at::Tensor& tensor, const ReduceOptions& opts) {
  const auto op = OpType::kReduce;
  check_tensor(tensor, "the", op, info());
  check_rank(opts.root, size(), "root", op, info());
  const auto& b = backend_for(tensor, "the");
  CallerStream caller_stream(tensor);
  Duration timeout = resolve(opts.timeout);
  check_fingerprint(b, op, tensor, {opts.root, static_cast<int64_t>(opts.op)}, timeout);
  return hold(b->reduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                        to_dtype(tensor.scalar_type()), opts.op, opts.root, timeout),
              {tensor});
}

WorkPtr ProcessGroup::send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) {
  const auto op = OpType::kSend;
  check_tensor(tensor, "the", op, info());
  check_rank(dst, size(), "destination", op, info());
  TORUS_CHECK(opts.tag >= 0, InvalidArgument, "send on group '{}': tag {} must be >= 0", name(), opts.tag);
  const auto& b = backend_for(tensor, "the");
  CallerStream caller_stream(tensor);
  return hold(b->send(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), to_dtype(tensor.scalar_type()), dst,
                      opts.tag, resolve(opts.timeout)),
              {tensor});
}

WorkPtr ProcessGroup::recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) {
  const auto op = OpType::kRecv;
  check_tensor(tensor, "the", op, info());
  check_rank(src, size(), "source", op, info());
  TORUS_CHECK(opts.tag >= 0, InvalidArgument, "recv on group '{}': tag {} must be >= 0", name(), opts.tag);
  const auto& b = backend_for(tensor, "the");
  CallerStream caller_stream(tensor);
  return hold(b->recv(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), to_dtype(tensor.scalar_type()), src,
                      opts.tag, resolve(opts.timeout)),
              {tensor});
}

WorkPtr ProcessGroup::barrier(const BarrierOptions& opts) {
  Duration timeout = resolve(opts.timeout);
  check_fingerprint(host_, OpType::kBarrier, at::Tensor(), {}, timeout);
  return host_->barrier(timeout);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, const std::string& group_name) {
  TORUS_CHECK(!group_name.empty(), InvalidArgument, "split of group '{}': the new group needs a name", name());
  auto host = host_->split(color, key, group_name, timeout_);
  BackendPtr device = device_ ? device_->split(color, key, group_name, timeout_) : nullptr;
  if (!host) return nullptr;
  auto pg = std::make_shared<ProcessGroup>(context_, std::move(host), std::move(device));
  pg->timeout_ = timeout_;
  pg->debug_ = debug_;
  return pg;
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& group_name) {
  TORUS_CHECK(!ranks.empty(), InvalidArgument, "new_group '{}': the rank list is empty", group_name);
  std::set<int> seen;
  for (int r : ranks) {
    TORUS_CHECK(r >= 0 && r < size(), InvalidArgument,
                "new_group '{}' of group '{}': listed rank {} is outside the group of {} ranks", group_name, name(), r,
                size());
    TORUS_CHECK(seen.insert(r).second, InvalidArgument, "new_group '{}': rank {} is listed twice", group_name, r);
  }
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  int color = it == ranks.end() ? -1 : 0;
  int key = it == ranks.end() ? 0 : static_cast<int>(it - ranks.begin());
  return split(color, key, group_name);
}

at::Tensor shared_host_zeros(at::IntArrayRef sizes, c10::ScalarType dtype) {
  uint64_t bytes = c10::elementSize(dtype);
  for (int64_t d : sizes) {
    TORUS_CHECK(d >= 0, InvalidArgument, "shared_host_zeros: negative size {} in [{}]", d, fmt::join(sizes, ", "));
    TORUS_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes), InvalidArgument,
                "shared_host_zeros: [{}] of {}-byte elements overflows", fmt::join(sizes, ", "),
                c10::elementSize(dtype));
  }
  bytes = std::max<uint64_t>(bytes, 1);
  void* p = shared_host_alloc(bytes);  // zeroed
  return at::from_blob(
      p, sizes, [](void* q) { shared_host_free(q); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

bool maybe_install_shared_host_allocator(const Context& ctx) {
  const SharedHostAllocPolicy policy = env_params().shared_host.alloc;
  if (policy == SharedHostAllocPolicy::kOff) return false;
  const auto& host_of = ctx.hosts().host_of_rank;
  const int mine = host_of.empty() ? 0 : host_of[static_cast<size_t>(ctx.rank())];
  const auto local = std::count(host_of.begin(), host_of.end(), mine);
  if (policy == SharedHostAllocPolicy::kAuto && (ctx.host_backend_name() != "ofi" || local < 2)) return false;
  const bool on = install_shared_host_allocator();
  if (ctx.rank() == 0) {
    if (on) {
      TORUS_LOG_INFO("CPU tensors of >= {} bytes now come from shared host memory, so same-host collectives on them "
                     "skip the staging copies (TORUS_SHARED_HOST_ALLOC=off keeps LibTorch's allocator)",
                     SharedHostAllocatorOptions::from_env().min_bytes);
    } else {
      TORUS_LOG_WARN("the shared host allocator could not replace LibTorch's CPU allocator; CPU tensors use "
                     "ordinary memory");
    }
  }
  return on;
}

void ProcessGroup::abort(const std::string& reason) {
  host_->abort(reason);
  if (device_) device_->abort(reason);
}

}  // namespace torus::comm

namespace torus {

comm::ProcessGroupPtr init(const comm::InitOptions& options) {
  auto ctx = comm::Context::create(options);
  comm::maybe_install_shared_host_allocator(*ctx);
  return std::make_shared<comm::ProcessGroup>(ctx, ctx->host_backend(), ctx->device_backend());
}

}  // namespace torus
