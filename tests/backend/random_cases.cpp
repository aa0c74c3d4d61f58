// Case generation and reference values of the randomized collective test
// (random_cases.h).
#include "random_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <set>

namespace torus::comm::rc {
namespace {

// A case's own generator; every rank seeds it identically.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t next() { return g_(); }
  // Uniform in [0, n), n > 0 (the modulo bias is irrelevant here).
  size_t below(size_t n) { return static_cast<size_t>(g_() % n); }
  int below(int n) { return static_cast<int>(g_() % static_cast<uint64_t>(n)); }
  bool chance(int percent) { return below(100) < percent; }
  // Log-uniform in [lo, hi], lo >= 1.
  size_t log_uniform(size_t lo, size_t hi) {
    if (hi <= lo) return lo;
    double x =
        std::log(static_cast<double>(lo)) + (std::log(static_cast<double>(hi)) - std::log(static_cast<double>(lo))) *
                                                (static_cast<double>(g_() >> 11) * 0x1p-53);
    return std::clamp(static_cast<size_t>(std::exp(x)), lo, hi);
  }

 private:
  std::mt19937_64 g_;
};

// Sizes at which the backends change algorithm or path (bytes): the ofi
// mailbox line (56), Open MPI's shared-memory eager limit and a page (4096),
// the ofi one-round limit (16 KiB), recursive doubling (32 KiB), the inline
// and zero-copy limits (64 KiB), segment stripes (64-128 KiB), the tree
// limit (256 KiB), the pipeline chunk (512 KiB), the stripe cap and stage
// size (1-2 MiB), and non-temporal stores (16 MiB).
constexpr size_t kThresholds[] = {56,
                                  64,
                                  4096,
                                  8192,
                                  16384,
                                  32768,
                                  65536,
                                  131072,
                                  262144,
                                  524288,
                                  size_t{1} << 20,
                                  size_t{2} << 20,
                                  size_t{4} << 20,
                                  size_t{16} << 20};

// Bytes of one buffer, before clamping to whole elements and to max_bytes.
size_t pick_bytes(Rng& rng, size_t elt, size_t max_bytes) {
  const int r = rng.below(100);
  if (r < 6) return 0;
  if (r < 12) return elt;
  if (r < 35) return elt * (2 + rng.below(size_t{99}));
  if (r < 55) return rng.log_uniform(100, std::max<size_t>(100, std::min<size_t>(65536, max_bytes)));
  if (r < 80) {
    std::vector<size_t> usable;
    for (size_t t : kThresholds) {
      if (t <= max_bytes) usable.push_back(t);
    }
    if (usable.empty()) return rng.log_uniform(1, std::max<size_t>(1, max_bytes));
    const size_t t = usable[rng.below(usable.size())];
    int64_t delta = rng.chance(60) ? rng.below(5) - 2 : rng.below(129) - 64;  // elements
    int64_t b = static_cast<int64_t>(t) + delta * static_cast<int64_t>(elt);
    return static_cast<size_t>(std::max<int64_t>(0, b));
  }
  return rng.log_uniform(std::min<size_t>(65536, max_bytes), std::max<size_t>(1, max_bytes));
}

// Elements of one buffer, at most `cap_bytes` in all.
size_t pick_count(Rng& rng, size_t elt, size_t cap_bytes) {
  size_t c = pick_bytes(rng, elt, cap_bytes) / elt;
  return std::min(c, cap_bytes / elt);
}

DType pick_dtype(Rng& rng) {
  // f16, bf16 and f32 more often: they carry the rounding contract.
  static constexpr DType kWeighted[] = {DType::kF32,  DType::kF32,  DType::kF64, DType::kF16, DType::kF16,
                                        DType::kBF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8};
  return kWeighted[rng.below(std::size(kWeighted))];
}

Kind pick_kind(Rng& rng) {
  static constexpr std::pair<Kind, int> kWeights[] = {
      {Kind::kAllReduce, 24}, {Kind::kReduceScatter, 12}, {Kind::kAllGather, 11}, {Kind::kAllToAll, 17},
      {Kind::kBroadcast, 10}, {Kind::kReduce, 13},        {Kind::kSendRecv, 9},   {Kind::kBarrier, 4}};
  int r = rng.below(100);
  for (auto [k, w] : kWeights) {
    if (r < w) return k;
    r -= w;
  }
  return Kind::kAllReduce;
}

void pick_all_to_all(Rng& rng, Op& op, int n, size_t max_bytes) {
  const size_t elt = dtype_size(op.dtype);
  const size_t un = static_cast<size_t>(n);
  const size_t cap = max_bytes / un;  // per block, so that no rank's buffer exceeds max_bytes
  op.a2a.assign(un * un, 0);
  const int mode = rng.below(100);
  if (mode < 20) {  // equal splits
    std::fill(op.a2a.begin(), op.a2a.end(), pick_count(rng, elt, cap));
    return;
  }
  for (auto& c : op.a2a) c = rng.chance(25) ? 0 : pick_count(rng, elt, cap);
  if (mode < 45 && n >= 2) {
    // Some ranks (not all) whose send and receive counts are all equal.
    const size_t c = rng.chance(40) ? 0 : pick_count(rng, elt, cap);
    const int uniform_ranks = 1 + rng.below(n - 1);
    std::vector<int> order(un);
    for (int r = 0; r < n; ++r) order[static_cast<size_t>(r)] = r;
    for (size_t i = un - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    for (int k = 0; k < uniform_ranks; ++k) {
      const size_t r = static_cast<size_t>(order[static_cast<size_t>(k)]);
      for (size_t d = 0; d < un; ++d) op.a2a[r * un + d] = op.a2a[d * un + r] = c;
    }
  } else if (mode < 60) {
    // Ranks that send nothing, receive nothing, or both.
    const int quiet = 1 + rng.below(std::max(1, n / 2));
    for (int k = 0; k < quiet; ++k) {
      const size_t r = rng.below(un);
      const int what = rng.below(3);
      for (size_t d = 0; d < un; ++d) {
        if (what != 1) op.a2a[r * un + d] = 0;
        if (what != 0) op.a2a[d * un + r] = 0;
      }
    }
  }
}

void pick_messages(Rng& rng, Op& op, int n, size_t max_bytes) {
  const size_t elt = dtype_size(op.dtype);
  const int m = 1 + rng.below(2 * n);
  static constexpr int kTags[] = {0, 0, 1, 2, 32767};
  for (int k = 0; k < m; ++k) {
    Message msg;
    msg.src = rng.below(n);
    msg.dst = rng.below(n);
    if (msg.dst == msg.src && n > 1 && !rng.chance(20)) msg.dst = (msg.src + 1 + rng.below(n - 1)) % n;
    msg.count = pick_count(rng, elt, std::max(elt, max_bytes / 4));
    msg.tag = rng.chance(80) ? kTags[rng.below(std::size(kTags))] : rng.below(32768);
    op.msgs.push_back(msg);
  }
}

void pick_places(Rng& rng, Op& op, int n) {
  op.place.resize(static_cast<size_t>(n));
  const int mode = rng.below(100);
  for (auto& p : op.place) {
    if (mode < 40) {
      p = rng.chance(50) ? Place::kHeap : Place::kHeapOffset;
    } else if (mode < 75) {
      p = rng.chance(60) ? Place::kShared : Place::kSharedOffset;
    } else {
      p = static_cast<Place>(rng.below(4));
    }
  }
}

Op make_op(Rng& rng, int n, const Limits& limits, uint64_t key) {
  Op op;
  op.key = key;
  op.kind = pick_kind(rng);
  op.dtype = pick_dtype(rng);
  op.rop = kAllReduceOps[rng.below(std::size(kAllReduceOps))];
  const size_t elt = dtype_size(op.dtype);
  const size_t un = static_cast<size_t>(n);
  switch (op.kind) {
    case Kind::kAllReduce:
    case Kind::kReduce:
    case Kind::kBroadcast:
      op.count = pick_count(rng, elt, limits.max_bytes);
      break;
    case Kind::kReduceScatter:
    case Kind::kAllGather: {
      // Half the time the size is that of the whole (n-block) buffer.
      size_t c = pick_count(rng, elt, limits.max_bytes);
      if (rng.chance(50)) c /= un;
      op.count = std::min(c, limits.max_bytes / elt / un);
      break;
    }
    case Kind::kAllToAll:
      pick_all_to_all(rng, op, n, limits.max_bytes);
      break;
    case Kind::kSendRecv:
      pick_messages(rng, op, n, limits.max_bytes);
      break;
    case Kind::kBarrier:
      break;
  }
  op.root = rng.below(n);
  const bool reduction = op.kind == Kind::kAllReduce || op.kind == Kind::kReduceScatter || op.kind == Kind::kReduce;
  op.in_place = (reduction || op.kind == Kind::kAllGather) && rng.chance(50);
  op.null_out = op.kind == Kind::kReduce && !op.in_place && rng.chance(30);
  const bool half = op.dtype == DType::kF16 || op.dtype == DType::kBF16;
  if (reduction && half && op.rop == ReduceOp::kSum && rng.chance(35)) op.values = Values::kProbe;
  switch (op.dtype) {
    case DType::kF16:
      op.scale = -rng.below(5);
      break;  // [-4, 0]: sums stay below 65504
    case DType::kBF16:
      op.scale = rng.below(17) - 8;
      break;
    case DType::kF32:
    case DType::kF64:
      op.scale = rng.below(33) - 16;
      break;
    default:
      op.scale = 0;
      break;
  }
  pick_places(rng, op, n);
  return op;
}

Partition random_partition(Rng& rng, int n) {
  Partition p;
  const int colors = 1 + rng.below(n);
  for (int r = 0; r < n; ++r) {
    p.color.push_back(rng.chance(15) ? -1 : rng.below(colors));
    p.key.push_back(rng.below(4));  // ties are broken by world rank
  }
  return p;
}

// Round to nearest even with `bits` significant bits (finite, normal range).
double round_to_bits(double v, int bits) {
  if (v == 0 || !std::isfinite(v)) return v;
  const int e = std::ilogb(v);
  const double ulp = std::ldexp(1.0, e - bits + 1);
  return std::nearbyint(v / ulp) * ulp;  // v / ulp is exact; nearbyint rounds to even by default
}

uint16_t bf16_bits(double v) {
  // round_to_bits made v exact in bf16, so the float conversion and the
  // truncation below are exact.
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(round_to_bits(v, 8))) >> 16);
}

bool is_float(DType t) {
  return dtype_is_floating(t);
}

// The value grid of one floating reduction: inputs are k * 2^scale.
double grid(const Op& op) {
  return std::ldexp(1.0, op.scale);
}

// Input of a floating dtype rounded so that it is representable.
double representable(DType t, double v) {
  switch (t) {
    case DType::kF16:
      return round_to_bits(v, 11);
    case DType::kBF16:
      return round_to_bits(v, 8);
    case DType::kF32:
      return round_to_bits(v, 24);
    default:
      return v;
  }
}

int64_t signed_in(uint64_t u, int64_t bound) {  // uniform in [-bound, bound], bound <= 2^62
  return static_cast<int64_t>(u % (2 * static_cast<uint64_t>(bound) + 1)) - bound;
}

}  // namespace

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kAllToAll:
      return "all_to_all";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
    case Kind::kSendRecv:
      return "send_recv";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::string_view place_name(Place p) {
  switch (p) {
    case Place::kHeap:
      return "heap";
    case Place::kHeapOffset:
      return "heap+1";
    case Place::kShared:
      return "shared";
    case Place::kSharedOffset:
      return "shared+1";
  }
  return "?";
}

std::string Op::describe() const {
  std::string s(kind_name(kind));
  const bool reduction = kind == Kind::kAllReduce || kind == Kind::kReduceScatter || kind == Kind::kReduce;
  if (kind == Kind::kBarrier) return s;
  if (reduction) s += fmt::format(" {}", reduce_op_name(rop));
  s += fmt::format(" {}", dtype_name(dtype));
  if (kind == Kind::kAllToAll) {
    const size_t n = static_cast<size_t>(std::sqrt(static_cast<double>(a2a.size())) + 0.5);
    s += " counts [";
    for (size_t r = 0; r < n; ++r) {
      s += fmt::format(
          "{}[{}]", r ? " " : "",
          fmt::join(a2a.begin() + static_cast<long>(r * n), a2a.begin() + static_cast<long>((r + 1) * n), ","));
    }
    s += "] (row = sender)";
  } else if (kind == Kind::kSendRecv) {
    s += " messages";
    for (const auto& m : msgs) s += fmt::format(" {}->{}:{}#{}", m.src, m.dst, m.count, m.tag);
  } else {
    s += fmt::format(" count {}", count);
  }
  if (kind == Kind::kBroadcast || kind == Kind::kReduce) s += fmt::format(" root {}", root);
  if (reduction || kind == Kind::kAllGather) s += in_place ? " in-place" : " out-of-place";
  if (null_out) s += " null-out";
  if (values == Values::kProbe) s += " probe";
  if (reduction && is_float(dtype)) s += fmt::format(" grid 2^{}", scale);
  std::vector<std::string_view> places;
  for (Place p : place) places.push_back(place_name(p));
  s += fmt::format(" placement [{}]", fmt::join(places, ","));
  return s;
}

std::vector<int> members_of(const Partition& p, int color) {
  std::vector<std::pair<int, int>> m;  // (key, world rank)
  for (size_t r = 0; r < p.color.size(); ++r) {
    if (p.color[r] == color) m.emplace_back(p.key[r], static_cast<int>(r));
  }
  std::sort(m.begin(), m.end());
  std::vector<int> out;
  for (auto [k, r] : m) out.push_back(r);
  return out;
}

Pool make_pool(uint64_t seed, int n, int random_partitions) {
  Pool pool;
  Rng rng(hash2(seed, 0x706f6f6cull));
  Partition singles, odd_even, reversed, leave_one_out;
  for (int r = 0; r < n; ++r) {
    singles.color.push_back(r);
    singles.key.push_back(0);
    odd_even.color.push_back(r % 2);
    odd_even.key.push_back(r);
    reversed.color.push_back(0);
    reversed.key.push_back(n - 1 - r);
    leave_one_out.color.push_back(r == n / 2 ? -1 : 0);
    leave_one_out.key.push_back(rng.below(4));
  }
  pool.partitions = {singles, odd_even, reversed};
  if (n >= 2) pool.partitions.push_back(leave_one_out);
  for (int i = 0; i < random_partitions; ++i) pool.partitions.push_back(random_partition(rng, n));

  GroupSpec world;
  world.name = "world";
  for (int r = 0; r < n; ++r) world.members.push_back(r);
  pool.groups.push_back(world);
  for (size_t p = 0; p < pool.partitions.size(); ++p) {
    std::set<int> colors(pool.partitions[p].color.begin(), pool.partitions[p].color.end());
    for (int c : colors) {
      if (c < 0) continue;
      GroupSpec g;
      g.partition = static_cast<int>(p);
      g.color = c;
      g.members = members_of(pool.partitions[p], c);
      g.name = fmt::format("p{}c{}", p, c);
      pool.groups.push_back(std::move(g));
    }
  }
  return pool;
}

Case make_case(uint64_t seed, uint64_t index, const Pool& pool, int world_size, const Limits& limits) {
  Rng rng(hash2(seed, index));
  Case c;
  c.index = index;
  if (rng.chance(2)) {
    c.split = true;
    c.split_partition = random_partition(rng, world_size);
    return c;
  }
  auto pick_group = [&] { return rng.chance(30) ? 0 : static_cast<int>(rng.below(pool.groups.size())); };
  const int mode = rng.below(100);
  const int ops = mode < 10 ? 2 + rng.below(3) : mode < 16 ? 2 + rng.below(2) : 1;
  const int first_group = pick_group();
  for (int k = 0; k < ops; ++k) {
    // 10%: a batch on one group; 6%: ops on several groups in flight at once.
    const int g = mode >= 10 && mode < 16 && k > 0 ? pick_group() : first_group;
    const int n = static_cast<int>(pool.groups[static_cast<size_t>(g)].members.size());
    c.ops.push_back(make_op(rng, n, limits, hash2(hash2(seed, index), static_cast<uint64_t>(k) + 1)));
    c.ops.back().group = g;
  }
  if (c.multi_group()) {
    c.shuffled = rng.chance(60);
    c.threaded = rng.chance(40);
  }
  const int w = rng.below(4);
  c.wait = w < 2 ? WaitStyle::kWaitTimeout : w == 2 ? WaitStyle::kWait : WaitStyle::kPoll;
  c.reverse_wait = c.ops.size() > 1 && rng.chance(50);
  return c;
}

bool Case::multi_group() const {
  for (const Op& op : ops) {
    if (op.group != ops[0].group) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// Values

void encode(DType t, const Num& v, void* p) {
  switch (t) {
    case DType::kF32: {
      float f = static_cast<float>(representable(t, v.f));
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kF64:
      std::memcpy(p, &v.f, 8);
      break;
    case DType::kF16: {
      _Float16 h = static_cast<_Float16>(representable(t, v.f));  // exact after the rounding
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBF16: {
      uint16_t b = bf16_bits(v.f);
      std::memcpy(p, &b, 2);
      break;
    }
    case DType::kI32: {
      int32_t x = static_cast<int32_t>(v.i);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::kI64:
      std::memcpy(p, &v.i, 8);
      break;
    case DType::kU8: {
      uint8_t x = static_cast<uint8_t>(v.i);
      std::memcpy(p, &x, 1);
      break;
    }
  }
}

Num decode(DType t, const void* p) {
  Num v;
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      v.f = f;
      break;
    }
    case DType::kF64:
      std::memcpy(&v.f, p, 8);
      break;
    case DType::kF16: {
      _Float16 h;
      std::memcpy(&h, p, 2);
      v.f = static_cast<double>(h);
      break;
    }
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      v.f = std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
      break;
    }
    case DType::kI32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      v.i = x;
      break;
    }
    case DType::kI64:
      std::memcpy(&v.i, p, 8);
      break;
    case DType::kU8:
      v.i = *static_cast<const uint8_t*>(p);
      break;
  }
  return v;
}

std::string format_element(DType t, const void* p) {
  const Num v = decode(t, p);
  uint64_t bits = 0;
  std::memcpy(&bits, p, dtype_size(t));
  if (is_float(t)) return fmt::format("{} (0x{:0{}x})", v.f, bits, 2 * dtype_size(t));
  return fmt::format("{}", v.i);
}

ReductionInputs::ReductionInputs(const Op& op, int n) : op_(op), n_(n), floating_(is_float(op.dtype)) {}

void ReductionInputs::column(size_t i, Num* out) const {
  const uint64_t h = hash2(op_.key, i);
  const DType t = op_.dtype;
  const int n = n_;
  auto u = [&](int r) { return hash2(h, static_cast<uint64_t>(r)); };
  if (op_.rop == ReduceOp::kProd) {
    const bool is_unsigned = t == DType::kU8;
    for (int r = 0; r < n; ++r) {
      const uint64_t x = u(r);
      const bool big = r < 6 && (x & 1);  // at most 6 factors of magnitude 2
      const bool negative = !is_unsigned && ((x >> 1) & 1);
      if (floating_) {
        double m = big ? (((x >> 2) & 1) ? 2.0 : 0.5) : 1.0;
        out[r].f = negative ? -m : m;
      } else {
        int64_t m = big ? 2 : 1;
        out[r].i = negative ? -m : m;
      }
    }
    return;
  }
  if (op_.rop == ReduceOp::kMax || op_.rop == ReduceOp::kMin) {
    for (int r = 0; r < n; ++r) {
      const uint64_t x = u(r);
      switch (t) {
        case DType::kF16:
          out[r].f = static_cast<double>(signed_in(x, 2047)) * grid(op_);
          break;
        case DType::kBF16:
          out[r].f = static_cast<double>(signed_in(x, 255)) * grid(op_);
          break;
        case DType::kF32:
          out[r].f = static_cast<double>(signed_in(x, (1 << 24) - 1)) * grid(op_);
          break;
        case DType::kF64:
          out[r].f = static_cast<double>(signed_in(x, int64_t{1} << 52)) * grid(op_);
          break;
        case DType::kI32:
          out[r].i = static_cast<int32_t>(x);
          break;
        case DType::kI64:
          out[r].i = static_cast<int64_t>(x);
          break;
        case DType::kU8:
          out[r].i = static_cast<uint8_t>(x);
          break;
      }
      // Every rank sees many equal values in small types; ties are fine.
    }
    return;
  }
  if (op_.values == Values::kProbe) {
    // One rank holds +-2^e, some others half an ulp of it, the rest 0.
    const int bits = t == DType::kBF16 ? 8 : 11;
    const int e = t == DType::kBF16 ? 8 + static_cast<int>(h % 5) : 11 + static_cast<int>(h % 4);
    const double sign = ((h >> 8) & 1) ? -1.0 : 1.0;
    const int big = static_cast<int>((h >> 16) % static_cast<uint64_t>(n));
    for (int r = 0; r < n; ++r) {
      if (r == big) {
        out[r].f = sign * std::ldexp(1.0, e);
      } else {
        out[r].f = (u(r) & 1) ? sign * std::ldexp(1.0, e - bits) : 0.0;
      }
    }
    return;
  }
  if (op_.rop == ReduceOp::kAvg && floating_) {
    // Integers whose sum is a multiple of n: the quotient is exact.
    int64_t bound = t == DType::kBF16  ? 200
                    : t == DType::kF16 ? 2000
                    : t == DType::kF32 ? (1 << 20)
                                       : (int64_t{1} << 40);
    int64_t sum = 0;
    for (int r = 0; r < n; ++r) {
      int64_t v = signed_in(u(r), bound);
      if (r == n - 1) v -= ((sum + v) % n + n) % n;
      sum += v;
      out[r].f = static_cast<double>(v);
    }
    return;
  }
  // kSum, and kAvg on integers.
  for (int r = 0; r < n; ++r) {
    const uint64_t x = u(r);
    switch (t) {
      case DType::kF16:
      case DType::kBF16: {
        // Any value of the type on the grid; the sum (exact in f32) may need
        // rounding back into the type.
        const int64_t bound = t == DType::kF16 ? std::min<int64_t>(4096, 60000 / n) : 4096;
        out[r].f = representable(t, static_cast<double>(signed_in(x, bound)) * grid(op_));
        break;
      }
      case DType::kF32:
        out[r].f = static_cast<double>(signed_in(x, (int64_t{1} << 23) / n)) * grid(op_);
        break;
      case DType::kF64:
        out[r].f = static_cast<double>(signed_in(x, (int64_t{1} << 52) / n)) * grid(op_);
        break;
      case DType::kI32:
        out[r].i = signed_in(x, (int64_t{1} << 31) / n - 1);
        break;
      case DType::kI64:
        out[r].i = signed_in(x, (int64_t{1} << 62) / n);
        break;
      case DType::kU8:
        out[r].i = static_cast<int64_t>(x % static_cast<uint64_t>(255 / n + 1));
        break;
    }
  }
}

void ReductionInputs::expected(const Num* col, void* p) const {
  Num acc = col[0];
  for (int r = 1; r < n_; ++r) {
    const Num& v = col[r];
    switch (op_.rop) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc.f += v.f;  // exact: the inputs were chosen for it
        acc.i += v.i;
        break;
      case ReduceOp::kProd:
        acc.f *= v.f;
        acc.i *= v.i;
        break;
      case ReduceOp::kMax:
        acc.f = std::max(acc.f, v.f);
        acc.i = std::max(acc.i, v.i);
        break;
      case ReduceOp::kMin:
        acc.f = std::min(acc.f, v.f);
        acc.i = std::min(acc.i, v.i);
        break;
    }
  }
  if (op_.rop == ReduceOp::kAvg) {
    acc.f /= n_;  // exact for floating inputs (a multiple of n)
    acc.i /= n_;  // truncates toward zero
  }
  encode(op_.dtype, acc, p);
}

std::string check_reference() {
  struct Known {
    DType t;
    ReduceOp op;
    std::vector<double> f;
    std::vector<int64_t> i;
    double want_f;
    int64_t want_i;
  };
  const Known known[] = {
      {DType::kBF16, ReduceOp::kSum, {256, 1, 1, 0}, {}, 258, 0},  // rounded once, not 256 (twice)
      {DType::kF16, ReduceOp::kSum, {2048, 1, 1, 0}, {}, 2050, 0},
      {DType::kBF16, ReduceOp::kSum, {256, 1}, {}, 256, 0},        // a tie goes to even
      {DType::kBF16, ReduceOp::kSum, {256, 1, 1, 1}, {}, 260, 0},  // 259 is a tie too
      {DType::kF16, ReduceOp::kSum, {-2048, -1, -1, -1, 0}, {}, -2052, 0},
      {DType::kBF16, ReduceOp::kAvg, {3, 4, 5}, {}, 4, 0},
      {DType::kF32, ReduceOp::kProd, {-2, 0.5, 2}, {}, -2, 0},
      {DType::kI32, ReduceOp::kAvg, {}, {-4, -3}, 0, -3},  // -7 / 2 truncates toward zero
      {DType::kU8, ReduceOp::kAvg, {}, {200, 55, 0}, 0, 85},
      {DType::kI64, ReduceOp::kMin, {}, {INT64_MIN, 5}, 0, INT64_MIN},
  };
  for (const Known& k : known) {
    Op op;
    op.dtype = k.t;
    op.rop = k.op;
    const int n = static_cast<int>(std::max(k.f.size(), k.i.size()));
    std::vector<Num> col(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      if (!k.f.empty()) col[static_cast<size_t>(r)].f = k.f[static_cast<size_t>(r)];
      if (!k.i.empty()) col[static_cast<size_t>(r)].i = k.i[static_cast<size_t>(r)];
    }
    ReductionInputs ri(op, n);
    char buf[8] = {};
    ri.expected(col.data(), buf);
    const Num got = decode(k.t, buf);
    if (dtype_is_floating(k.t) ? got.f != k.want_f : got.i != k.want_i) {
      return fmt::format("the reference gives {} for {} {} of [{}{}], expected {}", format_element(k.t, buf),
                         reduce_op_name(k.op), dtype_name(k.t), fmt::join(k.f, ","), fmt::join(k.i, ","),
                         dtype_is_floating(k.t) ? k.want_f : static_cast<double>(k.want_i));
    }
  }
  return "";
}

void movement_element(DType t, uint64_t key, uint64_t a, uint64_t b, size_t j, void* p) {
  const uint64_t x = hash2(hash2(key, a * 0x100000001b3ull + b), j);
  std::memcpy(p, &x, dtype_size(t));
}

bool a2a_mixed_equal(const Op& op, int n) {
  if (op.kind != Kind::kAllToAll) return false;
  const size_t un = static_cast<size_t>(n);
  int equal = 0;
  for (size_t r = 0; r < un; ++r) {
    bool eq = true;
    for (size_t d = 0; d < un; ++d) eq &= op.a2a[r * un + d] == op.a2a[r * un] && op.a2a[d * un + r] == op.a2a[r * un];
    equal += eq;
  }
  return equal > 0 && equal < n;
}

bool half_multi_host(const Op& op, const std::vector<int>& member_hosts) {
  if (op.dtype != DType::kF16 && op.dtype != DType::kBF16) return false;
  if (op.kind != Kind::kAllReduce && op.kind != Kind::kReduce) return false;
  std::vector<int> per_host;
  for (int h : member_hosts) {
    if (h >= static_cast<int>(per_host.size())) per_host.resize(static_cast<size_t>(h) + 1, 0);
    ++per_host[static_cast<size_t>(h)];
  }
  int hosts = 0, most = 0;
  for (int c : per_host) {
    hosts += c > 0;
    most = std::max(most, c);
  }
  return hosts > 1 && most >= 2;
}

}  // namespace torus::comm::rc
