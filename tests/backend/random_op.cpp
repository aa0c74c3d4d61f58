// Buffers, inputs and checks of one op of the randomized collective test
// (random_op.h).
#include "random_op.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "torus/comm/shared_host.h"

namespace torus::comm::rc {

std::string_view cat_name(Cat c) {
  switch (c) {
    case Cat::kPass:
      return "pass";
    case Cat::kExcluded:
      return "excluded";
    case Cat::kSkipped:
      return "skipped";
    case Cat::kError:
      return "error";
    case Cat::kHang:
      return "hang";
    case Cat::kClobber:
      return "clobber";
    case Cat::kWrong:
      return "wrong";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Region

Region::Region(Place place, size_t bytes, size_t elt, uint64_t key) : place_(place), bytes_(bytes), key_(key) {
  const bool offset = place == Place::kHeapOffset || place == Place::kSharedOffset;
  offset_ = kGuard + (offset ? elt : 0);
  total_ = offset_ + bytes + kGuard;
  if (place == Place::kShared || place == Place::kSharedOffset) {
    // Pool blocks (what the shared host allocator hands out) and single
    // allocations (shared_host_alloc) alike.
    pooled_ = (key >> 7) & 1;
    base_ = static_cast<char*>(pooled_ ? shared_host_pool_alloc(total_) : shared_host_alloc(total_));
  } else {
    base_ = static_cast<char*>(std::aligned_alloc(64, (total_ + 63) / 64 * 64));
    if (!base_) throw std::bad_alloc();
  }
  for (size_t k = 0; k < offset_; ++k) base_[k] = guard_byte(k);
  for (size_t k = offset_ + bytes_; k < total_; ++k) base_[k] = guard_byte(k);
  char* d = data();
  for (size_t j = 0; j < bytes_; j += 8) {
    const uint64_t x = hash2(key_ ^ 0x73656e74ull, j);
    std::memcpy(d + j, &x, std::min<size_t>(8, bytes_ - j));
  }
}

Region::~Region() {
  if (place_ == Place::kShared || place_ == Place::kSharedOffset) {
    if (!pooled_ || !shared_host_pool_free(base_)) shared_host_free(base_);
  } else {
    std::free(base_);
  }
}

char Region::guard_byte(size_t k) const {
  return static_cast<char>(0xa5 ^ (k * 29) ^ key_);
}

std::string Region::guard_damage() const {
  size_t before = 0, after = 0;
  for (size_t k = 0; k < offset_; ++k) before += base_[k] != guard_byte(k);
  for (size_t k = offset_ + bytes_; k < total_; ++k) after += base_[k] != guard_byte(k);
  if (before + after == 0) return "";
  return fmt::format("{} of the {} bytes before and {} of the {} bytes after a {}-byte {} buffer were overwritten",
                     before, offset_, after, kGuard, bytes_, place_name(place_));
}

// ---------------------------------------------------------------------------
// OpRun

Region& OpRun::region(size_t bytes, uint64_t salt) {
  regions_.push_back(std::make_unique<Region>(op_.place[static_cast<size_t>(me_)], bytes, elt_,
                                              hash2(op_.key, salt * 1000 + static_cast<uint64_t>(me_))));
  return *regions_.back();
}

void OpRun::expect_output(const char* at, std::vector<char> want, std::string what, Region* r,
                          std::function<std::string(size_t)> explain) {
  expects_.push_back({at, std::move(want), true, std::move(what), std::move(explain), r});
}

void OpRun::expect_unchanged(const char* at, size_t bytes, std::string what) {
  expects_.push_back({at, std::vector<char>(at, at + bytes), false, std::move(what), {}, nullptr});
}

std::function<std::string(size_t)> OpRun::explain_column(size_t first_column) const {
  return [op = op_, n = n_, first_column](size_t i) {
    ReductionInputs ri(op, n);
    std::vector<Num> col(static_cast<size_t>(n));
    ri.column(first_column + i, col.data());
    std::vector<std::string> parts;
    std::vector<char> e(8);
    for (const Num& v : col) {
      encode(op.dtype, v, e.data());
      parts.push_back(format_element(op.dtype, e.data()));
    }
    return fmt::format("; inputs of group ranks 0..{}: [{}]", n - 1, fmt::join(parts, ", "));
  };
}

OpRun::OpRun(const Op& op, Backend& g, Duration timeout)
    : op_(op), g_(g), timeout_(timeout), n_(g.size()), me_(g.rank()), elt_(dtype_size(op.dtype)) {
  const size_t c = op_.count, un = static_cast<size_t>(n_), me = static_cast<size_t>(me_);
  const DType dt = op_.dtype;
  const size_t elt = elt_;
  Backend* b = &g_;
  const Duration T = timeout_;
  switch (op_.kind) {
    case Kind::kAllReduce: {
      ReductionInputs ri(op_, n_);
      Region& in = region(c * elt, 1);
      std::vector<char> want(c * elt);
      std::vector<Num> col(un);
      for (size_t i = 0; i < c; ++i) {
        ri.column(i, col.data());
        encode(dt, col[me], in.data() + i * elt);
        ri.expected(col.data(), want.data() + i * elt);
      }
      Region* outr = op_.in_place ? &in : &region(c * elt, 2);
      if (!op_.in_place) expect_unchanged(in.data(), c * elt, "the input");
      expect_output(outr->data(), std::move(want), "the output", outr, explain_column(0));
      char *i = in.data(), *o = outr->data();
      const ReduceOp rop = op_.rop;
      issue_.push_back([=] { return b->all_reduce(i, o, c, dt, rop, T); });
      break;
    }
    case Kind::kReduceScatter: {
      ReductionInputs ri(op_, n_);
      Region& in = region(un * c * elt, 1);
      std::vector<char> want(c * elt);
      std::vector<Num> col(un);
      for (size_t j = 0; j < un * c; ++j) {
        ri.column(j, col.data());
        encode(dt, col[me], in.data() + j * elt);
        if (j / c == me) ri.expected(col.data(), want.data() + (j - me * c) * elt);
      }
      char* out;
      Region* outr;
      if (op_.in_place) {
        out = in.data() + me * c * elt;
        outr = &in;
        expect_unchanged(in.data(), me * c * elt, "the blocks of the input before this rank's");
        expect_unchanged(in.data() + (me + 1) * c * elt, (un - me - 1) * c * elt,
                         "the blocks of the input after this rank's");
      } else {
        outr = &region(c * elt, 2);
        out = outr->data();
        expect_unchanged(in.data(), un * c * elt, "the input");
      }
      expect_output(out, std::move(want), "the output", outr, explain_column(me * c));
      char* i = in.data();
      const ReduceOp rop = op_.rop;
      issue_.push_back([=] { return b->reduce_scatter(i, out, c, dt, rop, T); });
      break;
    }
    case Kind::kAllGather: {
      Region& outr = region(un * c * elt, 2);
      std::vector<char> want(un * c * elt);
      for (size_t r = 0; r < un; ++r) {
        for (size_t j = 0; j < c; ++j) movement_element(dt, op_.key, r, 0, j, want.data() + (r * c + j) * elt);
      }
      char* in;
      if (op_.in_place) {
        in = outr.data() + me * c * elt;
      } else {
        in = region(c * elt, 1).data();
      }
      std::memcpy(in, want.data() + me * c * elt, c * elt);
      if (!op_.in_place) expect_unchanged(in, c * elt, "the input");
      expect_output(outr.data(), std::move(want), "the output", &outr,
                    [c](size_t i) { return fmt::format(" (block of group rank {})", i / std::max<size_t>(c, 1)); });
      char* o = outr.data();
      issue_.push_back([=] { return b->all_gather(in, o, c, dt, T); });
      break;
    }
    case Kind::kAllToAll: {
      size_t sends = 0, recvs = 0;
      for (size_t r = 0; r < un; ++r) {
        send_counts_.push_back(op_.a2a[me * un + r]);
        recv_counts_.push_back(op_.a2a[r * un + me]);
        sends += send_counts_.back();
        recvs += recv_counts_.back();
      }
      Region& in = region(sends * elt, 1);
      Region& outr = region(recvs * elt, 2);
      size_t off = 0;
      for (size_t d = 0; d < un; ++d) {
        for (size_t j = 0; j < send_counts_[d]; ++j)
          movement_element(dt, op_.key, me, d, j, in.data() + (off + j) * elt);
        off += send_counts_[d];
      }
      std::vector<char> want(recvs * elt);
      std::vector<size_t> block_start;
      off = 0;
      for (size_t s = 0; s < un; ++s) {
        block_start.push_back(off);
        for (size_t j = 0; j < recv_counts_[s]; ++j)
          movement_element(dt, op_.key, s, me, j, want.data() + (off + j) * elt);
        off += recv_counts_[s];
      }
      expect_unchanged(in.data(), sends * elt, "the input");
      expect_output(outr.data(), std::move(want), "the output", &outr, [block_start](size_t i) {
        size_t s = 0;
        while (s + 1 < block_start.size() && block_start[s + 1] <= i) ++s;
        return fmt::format(" (element {} of the block from group rank {})", i - block_start[s], s);
      });
      char *i = in.data(), *o = outr.data();
      issue_.push_back([=, this] { return b->all_to_all(i, o, send_counts_, recv_counts_, dt, T); });
      break;
    }
    case Kind::kBroadcast: {
      const int root = op_.root;
      Region& buf = region(c * elt, 1);
      std::vector<char> want(c * elt);
      for (size_t j = 0; j < c; ++j)
        movement_element(dt, op_.key, static_cast<uint64_t>(root), 0, j, want.data() + j * elt);
      if (me_ == root) std::memcpy(buf.data(), want.data(), c * elt);
      expect_output(buf.data(), std::move(want), me_ == root ? "the root's buffer" : "the buffer", &buf);
      char* p = buf.data();
      issue_.push_back([=] { return b->broadcast(p, c, dt, root, T); });
      break;
    }
    case Kind::kReduce: {
      const int root = op_.root;
      ReductionInputs ri(op_, n_);
      Region& in = region(c * elt, 1);
      std::vector<char> want(me_ == root ? c * elt : 0);
      std::vector<Num> col(un);
      for (size_t i = 0; i < c; ++i) {
        ri.column(i, col.data());
        encode(dt, col[me], in.data() + i * elt);
        if (me_ == root) ri.expected(col.data(), want.data() + i * elt);
      }
      char* out = nullptr;
      if (op_.in_place) {
        out = in.data();
      } else if (me_ == root || !op_.null_out) {
        out = region(c * elt, 2).data();
      }
      if (me_ == root) {
        if (!op_.in_place) expect_unchanged(in.data(), c * elt, "the input");
        expect_output(out, std::move(want), "the root's output", op_.in_place ? &in : regions_.back().get(),
                      explain_column(0));
      } else {
        expect_unchanged(in.data(), c * elt, op_.in_place ? "a non-root's buffer (in == out)" : "the input");
        if (out && !op_.in_place) expect_unchanged(out, c * elt, "a non-root's output");
      }
      char* i = in.data();
      const ReduceOp rop = op_.rop;
      issue_.push_back([=] { return b->reduce(i, out, c, dt, rop, root, T); });
      break;
    }
    case Kind::kSendRecv: {
      // Sends and receives each in list order (messages between a pair with
      // one tag must not overtake each other), interleaved at random.
      std::vector<std::function<WorkPtr()>> sends, recvs;
      for (size_t k = 0; k < op_.msgs.size(); ++k) {
        const Message m = op_.msgs[k];
        const size_t bytes = m.count * elt;
        if (m.src == me_) {
          Region& r = region(bytes, 10 + 2 * k);
          for (size_t j = 0; j < m.count; ++j) movement_element(dt, op_.key, k, 1, j, r.data() + j * elt);
          expect_unchanged(r.data(), bytes, fmt::format("the buffer of message {} sent", k));
          char* p = r.data();
          sends.push_back([=] { return b->send(p, m.count, dt, m.dst, m.tag, T); });
        }
        if (m.dst == me_) {
          Region& r = region(bytes, 11 + 2 * k);
          std::vector<char> want(bytes);
          for (size_t j = 0; j < m.count; ++j) movement_element(dt, op_.key, k, 1, j, want.data() + j * elt);
          expect_output(
              r.data(), std::move(want),
              fmt::format("message {} ({} -> {}, tag {}, {} elements) received", k, m.src, m.dst, m.tag, m.count), &r);
          char* p = r.data();
          recvs.push_back([=] { return b->recv(p, m.count, dt, m.src, m.tag, T); });
        }
      }
      size_t s = 0, r = 0, step = 0;
      while (s < sends.size() || r < recvs.size()) {
        const bool take_send =
            r == recvs.size() || (s < sends.size() && (hash2(op_.key ^ static_cast<uint64_t>(me_), step) & 1));
        issue_.push_back(take_send ? sends[s++] : recvs[r++]);
        ++step;
      }
      break;
    }
    case Kind::kBarrier:
      issue_.push_back([=] { return b->barrier(T); });
      break;
  }
}

void OpRun::issue() {
  for (auto& f : issue_) {
    auto at = std::chrono::steady_clock::now();
    works_.push_back({f(), at});
  }
}

std::pair<Cat, std::string> OpRun::check() const {
  Cat worst = Cat::kPass;
  std::string what;
  auto note = [&](Cat c, std::string s) {
    if (c > worst) {
      worst = c;
      what = std::move(s);
    }
  };
  for (const auto& r : regions_) {
    std::string d = r->guard_damage();
    if (!d.empty()) note(Cat::kClobber, "wrote outside its buffers: " + d);
  }
  const bool floating = dtype_is_floating(op_.dtype);
  for (const Expect& e : expects_) {
    const size_t count = e.want.size() / elt_;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; ++i) {
      const char* got = e.at + i * elt_;
      const char* want = e.want.data() + i * elt_;
      if (std::memcmp(got, want, elt_) == 0) continue;
      // +0 and -0 are the same result of a reduction.
      if (floating && e.output && decode(op_.dtype, got).f == 0 && decode(op_.dtype, want).f == 0) continue;
      if (bad++ == 0) first = i;
    }
    if (bad == 0) continue;
    const std::string detail =
        fmt::format("{} of {} elements of {} wrong; first at element {}: expected {}, got {}{}", bad, count, e.what,
                    first, format_element(op_.dtype, e.want.data() + first * elt_),
                    format_element(op_.dtype, e.at + first * elt_), e.explain ? e.explain(first) : "");
    note(e.output ? Cat::kWrong : Cat::kClobber, e.output ? detail : "changed what it must leave alone: " + detail);
  }
  return {worst, what};
}

bool OpRun::has_output() const {
  for (const Expect& e : expects_) {
    if (e.output && !e.want.empty()) return true;
  }
  return false;
}

void OpRun::corrupt_output() {
  for (const Expect& e : expects_) {
    if (e.output && !e.want.empty()) {
      const_cast<char*>(e.at)[0] ^= 0x01;
      return;
    }
  }
}

void OpRun::damage_output_guard() {
  for (const Expect& e : expects_) {
    if (e.output && e.region) {
      e.region->damage_guard();
      return;
    }
  }
  if (!regions_.empty()) regions_.front()->damage_guard();
}

}  // namespace torus::comm::rc
