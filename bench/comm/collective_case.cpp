// bench/comm/collective_case.cpp — buffers, data, issue and check of one
// collective at one size (collective_case.h).
#include "collective_case.h"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "common/sweep.h"
#include <c10/core/CPUAllocator.h>

#include "torus/comm/shared_host.h"
#include "torus/core/error.h"

namespace torus::bench {
namespace {

// 16-bit floats as bit patterns; conversions only for the small non-negative
// integers of the pattern (exact), and from any bits back to double.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <class T>
T from_int(int64_t v) {
  return static_cast<T>(v);
}
template <>
Half from_int<Half>(int64_t v) {
  if (v == 0) return {0};
  const uint32_t f = std::bit_cast<uint32_t>(static_cast<float>(v));
  const uint32_t exp = ((f >> 23) & 0xff) - 127 + 15;
  return {static_cast<uint16_t>((exp << 10) | ((f >> 13) & 0x3ff))};
}
template <>
BFloat16 from_int<BFloat16>(int64_t v) {
  return {static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16)};
}

template <class T>
double to_double(T v) {
  return static_cast<double>(v);
}
template <>
double to_double<Half>(Half h) {
  const int exp = (h.bits >> 10) & 0x1f;
  const int mant = h.bits & 0x3ff;
  const double sign = (h.bits & 0x8000) ? -1.0 : 1.0;
  if (exp == 31) return mant != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}
template <>
double to_double<BFloat16>(BFloat16 b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16);
}

template <class T>
struct Tag {
  using type = T;
};

template <class Fn>
decltype(auto) with_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32:
      return fn(Tag<float>{});
    case DType::kF64:
      return fn(Tag<double>{});
    case DType::kF16:
      return fn(Tag<Half>{});
    case DType::kBF16:
      return fn(Tag<BFloat16>{});
    case DType::kI32:
      return fn(Tag<int32_t>{});
    case DType::kI64:
      return fn(Tag<int64_t>{});
    case DType::kU8:
      return fn(Tag<uint8_t>{});
  }
  throw InvalidArgument("unknown dtype");
}

// Largest integer a reduction of the pattern may reach in `t` and stay exact.
int64_t exact_limit(DType t) {
  switch (t) {
    case DType::kU8:
      return 255;
    case DType::kBF16:
      return 256;
    case DType::kF16:
      return 2048;
    case DType::kF32:
      return int64_t{1} << 24;
    case DType::kI32:
      return std::numeric_limits<int32_t>::max();
    case DType::kF64:
    case DType::kI64:
      return int64_t{1} << 53;
  }
  return 255;
}

void fill(DType t, std::byte* p, size_t count, const std::vector<int64_t>& table) {
  with_type(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = reinterpret_cast<T*>(p);
    for_each_expected(table, 0, count, [&](size_t i, int64_t v) { out[i] = from_int<T>(v); });
  });
}

int64_t count_wrong(DType t, const std::byte* p, size_t count, const std::vector<int64_t>& table, size_t first) {
  return with_type(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = reinterpret_cast<const T*>(p);
    int64_t wrong = 0;
    for_each_expected(table, first, count,
                      [&](size_t i, int64_t v) { wrong += to_double(in[i]) != static_cast<double>(v); });
    return wrong;
  });
}

}  // namespace

CollectiveCase::Buffer CollectiveCase::allocate(size_t bytes, BufferKind kind) {
  if (bytes == 0) return Buffer(nullptr);
  switch (kind) {
    case BufferKind::kShared:
      return Buffer(static_cast<std::byte*>(comm::shared_host_alloc(bytes)), FreeDeleter{&comm::shared_host_free});
    case BufferKind::kTensor: {
      c10::Allocator* a = c10::GetCPUAllocator();
      return Buffer(static_cast<std::byte*>(a->raw_allocate(bytes)), FreeDeleter{a->raw_deleter()});
    }
    case BufferKind::kHeap:
      break;
  }
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return Buffer(static_cast<std::byte*>(p), FreeDeleter{&std::free});
}

CollectiveCase::CollectiveCase(comm::Backend& backend, comm::OpType op, DType dtype, comm::ReduceOp redop, int root,
                               size_t bytes, comm::Duration timeout, BufferKind buffers)
    : backend_(backend),
      op_(op),
      dtype_(dtype),
      redop_(redop),
      root_(root),
      timeout_(timeout),
      rank_(backend.rank()),
      n_(backend.size()),
      elt_(dtype_size(dtype)) {
  const std::string_view name = comm::op_type_name(op);
  count_ = op_count(name, bytes, elt_, n_);
  block_ = op_splits_per_rank(name) ? count_ / n_ : count_;
  pattern_.m = modulus_for(exact_limit(dtype), n_);
  const size_t full = count_ * elt_, block = block_ * elt_;
  switch (op) {
    case comm::OpType::kReduceScatter:
      in_bytes_ = full, out_bytes_ = block;
      break;
    case comm::OpType::kAllGather:
      in_bytes_ = block, out_bytes_ = full;
      break;
    case comm::OpType::kBroadcast:
      in_bytes_ = 0, out_bytes_ = full;
      break;
    case comm::OpType::kAllReduce:
    case comm::OpType::kAllToAll:
    case comm::OpType::kReduce:
      in_bytes_ = full, out_bytes_ = full;
      break;
    default:
      throw InvalidArgument("torus-bench-comm measures collectives only, not " + std::string(name));
  }
  in_ = allocate(in_bytes_, buffers);
  out_ = allocate(out_bytes_, buffers);
  split_counts_.assign(static_cast<size_t>(n_), block_);
}

bool CollectiveCase::has(Placement p) const {
  if (op_ == comm::OpType::kAllToAll) return p == Placement::kOutOfPlace;
  if (op_ == comm::OpType::kBroadcast) return p == Placement::kInPlace;
  return true;
}

std::byte* CollectiveCase::in_place_input() {
  switch (op_) {
    case comm::OpType::kReduceScatter:
      return in_.get();
    case comm::OpType::kAllGather:
      return out_.get() + rank_ * block_ * elt_;
    default:
      return out_.get();
  }
}

std::byte* CollectiveCase::in_place_output() {
  switch (op_) {
    case comm::OpType::kReduceScatter:
      return in_.get() + rank_ * block_ * elt_;
    default:
      return out_.get();
  }
}

void CollectiveCase::prepare(Placement p) {
  const auto own = pattern_.table(rank_, 0);
  if (out_bytes_ > 0) std::memset(out_.get(), 0xff, out_bytes_);
  switch (op_) {
    case comm::OpType::kAllToAll:
      for (int d = 0; d < n_; ++d) fill(dtype_, in_.get() + d * block_ * elt_, block_, pattern_.table(rank_, d));
      return;
    case comm::OpType::kBroadcast:
      fill(dtype_, out_.get(), count_, own);
      return;
    default:
      break;
  }
  const size_t in_count = op_ == comm::OpType::kAllGather ? block_ : count_;
  fill(dtype_, p == Placement::kInPlace ? in_place_input() : in_.get(), in_count, own);
}

comm::WorkPtr CollectiveCase::issue(Placement p) {
  const bool ip = p == Placement::kInPlace;
  std::byte* in = ip ? in_place_input() : in_.get();
  std::byte* out = ip ? in_place_output() : out_.get();
  switch (op_) {
    case comm::OpType::kAllReduce:
      return backend_.all_reduce(in, out, count_, dtype_, redop_, timeout_);
    case comm::OpType::kReduceScatter:
      return backend_.reduce_scatter(in, out, block_, dtype_, redop_, timeout_);
    case comm::OpType::kAllGather:
      return backend_.all_gather(in, out, block_, dtype_, timeout_);
    case comm::OpType::kAllToAll:
      return backend_.all_to_all(in, out, split_counts_, split_counts_, dtype_, timeout_);
    case comm::OpType::kBroadcast:
      return backend_.broadcast(out_.get(), count_, dtype_, root_, timeout_);
    case comm::OpType::kReduce:
      return backend_.reduce(in, out, count_, dtype_, redop_, root_, timeout_);
    default:
      throw InvalidArgument("not a collective");
  }
}

int64_t CollectiveCase::wrong(Placement p) const {
  const std::string_view redop = comm::reduce_op_name(redop_);
  const std::byte* out = out_.get();
  switch (op_) {
    case comm::OpType::kAllReduce:
      return count_wrong(dtype_, out, count_, pattern_.reduced_table(n_, redop), 0);
    case comm::OpType::kReduce:
      return rank_ == root_ ? count_wrong(dtype_, out, count_, pattern_.reduced_table(n_, redop), 0) : 0;
    case comm::OpType::kReduceScatter:
      if (p == Placement::kInPlace) out = in_.get() + rank_ * block_ * elt_;
      return count_wrong(dtype_, out, block_, pattern_.reduced_table(n_, redop), rank_ * block_);
    case comm::OpType::kAllGather:
    case comm::OpType::kAllToAll: {
      int64_t wrong = 0;
      for (int s = 0; s < n_; ++s) {
        const auto expected = op_ == comm::OpType::kAllGather ? pattern_.table(s, 0) : pattern_.table(s, rank_);
        wrong += count_wrong(dtype_, out + s * block_ * elt_, block_, expected, 0);
      }
      return wrong;
    }
    case comm::OpType::kBroadcast:
      return count_wrong(dtype_, out, count_, pattern_.table(root_, 0), 0);
    default:
      return 0;
  }
}

}  // namespace torus::bench
