// Reading an opened checkpoint into tensors (checkpoint.h): the stored
// pieces (stored.h: files mapped on first use and verified beside the
// reads, Note [Verified reads]) as tensors, and any slice of a tensor
// assembled from the pieces that cover it — flat ranges, boxes of another
// layout, padding — for load_into() and read_full().
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>

#include "checkpoint/checkpoint_impl.h"
#include "core/log.h"

namespace torus::ckpt {

at::Tensor Checkpoint::Impl::piece_tensor(const std::string& name, const Piece& pc, c10::ScalarType dtype) const {
  const uint8_t* p = piece_data(name, pc, dtype_code(dtype));
  const std::vector<int64_t> shape = pc.fb >= 0 ? std::vector<int64_t>{pc.fe - pc.fb} : pc.box;
  const auto opts = at::TensorOptions().dtype(dtype);
  const size_t esize = c10::elementSize(dtype);
  if (reinterpret_cast<uintptr_t>(p) % esize != 0) {
    at::Tensor t = at::empty(shape, opts);
    std::memcpy(t.data_ptr(), p, static_cast<size_t>(numel_of(shape)) * esize);
    return t;
  }
  return at::from_blob(const_cast<uint8_t*>(p), shape, opts);
}

bool Checkpoint::Impl::copy_flat(const std::string& name, const GlobalTensor& g,
                                 const std::vector<const Piece*>& pieces, const Normal& n, at::Tensor& dst) const {
  std::vector<const Piece*> same;
  for (const Piece* pc : pieces) {
    if (pc->fb >= 0 && pc->off == n.off && pc->box == n.box && pc->fe > n.fb && pc->fb < n.fe) same.push_back(pc);
  }
  std::sort(same.begin(), same.end(), [](const Piece* a, const Piece* b) { return a->fb < b->fb; });
  int64_t reach = n.fb;
  for (const Piece* pc : same) {
    if (pc->fb > reach) return false;
    reach = std::max(reach, pc->fe);
  }
  if (reach < n.fe) return false;
  at::Tensor flat = dst.view({-1});
  reach = n.fb;
  for (const Piece* pc : same) {
    const int64_t lo = std::max(reach, pc->fb), hi = std::min(n.fe, pc->fe);
    if (hi <= lo) continue;
    at::Tensor src = piece_tensor(name, *pc, dtype_from_code(g.dtype));
    flat.slice(0, lo - n.fb, hi - n.fb).copy_(src.slice(0, lo - pc->fb, hi - pc->fb));
    reach = hi;
  }
  return true;
}

int64_t Checkpoint::Impl::fill_box(const std::string& name, const GlobalTensor& g,
                                   const std::vector<const Piece*>& pieces, const std::vector<int64_t>& off,
                                   const std::vector<int64_t>& box, at::Tensor& dst) const {
  // Group flat pieces by box; whole pieces stand alone.
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<const Piece*>> groups;
  for (const Piece* pc : pieces) groups[{pc->off, pc->box}].push_back(pc);
  int64_t covered = 0;
  const size_t nd = g.shape.size();
  for (auto& [key, group] : groups) {
    const auto& [poff, pbox] = key;
    // Intersection with the target box, inside the global shape.
    std::vector<int64_t> lo(nd), hi(nd);
    bool empty = false;
    for (size_t d = 0; d < nd; ++d) {
      lo[d] = std::max(off[d], poff[d]);
      hi[d] = std::min({off[d] + box[d], poff[d] + pbox[d], g.shape[d]});
      if (hi[d] <= lo[d]) empty = true;
    }
    if (empty && nd > 0) continue;
    at::Tensor src;
    const Piece* whole = nullptr;
    for (const Piece* pc : group) {
      if (pc->fb < 0) whole = pc;
    }
    if (whole) {
      src = piece_tensor(name, *whole, dtype_from_code(g.dtype));
    } else {
      // Flat pieces of one box: lay them out in the box (missing ranges stay
      // NaN-free zeros and are caught by the coverage count below).
      at::Tensor flat = at::zeros({numel_of(pbox)}, at::TensorOptions().dtype(dtype_from_code(g.dtype)));
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (const Piece* pc : group) {
        if (pc->fe > pc->fb) flat.slice(0, pc->fb, pc->fe).copy_(piece_tensor(name, *pc, dtype_from_code(g.dtype)));
        ranges.emplace_back(pc->fb, pc->fe);
      }
      // Every element of the box inside the global shape must be covered.
      std::sort(ranges.begin(), ranges.end());
      int64_t reach = 0;
      for (auto [b, e] : ranges) {
        if (b > reach) break;
        reach = std::max(reach, e);
      }
      if (reach < numel_of(pbox)) {
        // Only padding may be missing: check that the uncovered tail lies
        // outside the global shape (rows of a padded vocabulary).
        bool tail_is_padding = nd > 0;
        if (tail_is_padding) {
          const int64_t inner = numel_of(pbox) / std::max<int64_t>(1, pbox[0]);
          const int64_t first_row = inner > 0 ? reach / inner : 0;
          tail_is_padding = poff[0] + first_row >= g.shape[0];
        }
        TORUS_CHECK(tail_is_padding, ckpt::CheckpointError,
                    "checkpoint: {}: '{}' is not fully saved: its pieces cover elements [0, {}) of a block of {}",
                    path, name, reach, numel_of(pbox));
      }
      src = flat.view(pbox);
    }
    at::Tensor s = src, t = dst;
    for (size_t d = 0; d < nd; ++d) {
      s = s.narrow(static_cast<int64_t>(d), lo[d] - poff[d], hi[d] - lo[d]);
      t = t.narrow(static_cast<int64_t>(d), lo[d] - off[d], hi[d] - lo[d]);
    }
    t.copy_(s);
    int64_t n = 1;
    for (size_t d = 0; d < nd; ++d) n *= hi[d] - lo[d];
    covered += n;
  }
  return covered;
}

void Checkpoint::verify() const {
  try {
    for (size_t i = 0; i < impl_->files.size(); ++i) {
      (void)impl_->file(static_cast<int>(i), true);  // size, header, run id and step; SHA-256 started
    }
    impl_->check();
    for (const auto& [name, g] : impl_->tensors) {
      for (const auto& pc : g.pieces) (void)impl_->piece_tensor(name, pc, dtype_from_code(g.dtype));
    }
  } catch (...) {
    impl_->drain();
    throw;
  }
}

void Checkpoint::verify_files(int part, int parts) const { impl_->verify_files(part, parts); }

void Checkpoint::set_hash_reads(bool on) { impl_->hash_reads = on; }

std::vector<std::string> Checkpoint::load_into(ShardedState& target, int rank, bool same_layout) const {
  const Impl& m = *impl_;
  std::vector<std::string> missing;
  try {
  for (auto& [key, s] : target) {
    std::string name = key;
    if (!s.alias_of.empty()) name = s.alias_of;
    auto it = m.tensors.find(name);
    if (it == m.tensors.end()) {
      missing.push_back(key);
      continue;
    }
    const GlobalTensor& g = it->second;
    TORUS_CHECK(g.shape == s.global_shape, ckpt::CheckpointError,
                "checkpoint: {}: '{}' has shape [{}] in the checkpoint, [{}] in this run", m.path, name,
                fmt::join(g.shape, ", "), fmt::join(s.global_shape, ", "));
    Normal n = normalize(key, s);
    std::vector<const Piece*> pieces;
    if (s.per_rank) {
      if (!same_layout) {
        missing.push_back(key);
        continue;
      }
      for (const auto& pc : g.pieces) {
        if (pc.rank == rank) pieces.push_back(&pc);
      }
      if (pieces.empty()) {
        missing.push_back(key);
        continue;
      }
    } else {
      for (const auto& pc : g.pieces) pieces.push_back(&pc);
    }
    at::NoGradGuard no_grad;
    if (n.fb >= 0 && m.copy_flat(name, g, pieces, n, s.tensor)) continue;
    int64_t need = 1;
    bool padded = false;
    for (size_t d = 0; d < g.shape.size(); ++d) {
      need *= std::max<int64_t>(0, std::min(n.off[d] + n.box[d], g.shape[d]) - n.off[d]);
      padded = padded || n.off[d] + n.box[d] > g.shape[d];
    }
    // A whole box of the stored dtype is filled in place; anything else
    // through a box of the stored dtype.
    const bool direct = n.fb < 0 && s.tensor.scalar_type() == dtype_from_code(g.dtype) && s.tensor.is_contiguous() &&
                        s.tensor.device().is_cpu();
    at::Tensor box = direct ? s.tensor : at::empty(n.box, at::TensorOptions().dtype(dtype_from_code(g.dtype)));
    if (padded || !direct) box.zero_();
    const int64_t covered = m.fill_box(name, g, pieces, n.off, n.box, box);
    TORUS_CHECK(covered == need, ckpt::CheckpointError,
                "checkpoint: {}: the pieces of '{}' cover {} of the {} elements this rank needs", m.path, name,
                covered, need);
    if (!direct) {
      at::Tensor src = n.fb >= 0 ? box.reshape({-1}).slice(0, n.fb, n.fe) : box;
      s.tensor.copy_(src.view(s.tensor.sizes()));
    }
  }
  m.check();
  return missing;
  } catch (...) {
    m.drain();
    throw;
  }
}

at::Tensor Checkpoint::read_full(const std::string& name) const {
  const Impl& m = *impl_;
  auto it = m.tensors.find(name);
  TORUS_CHECK(it != m.tensors.end(), ckpt::CheckpointError, "checkpoint: {} has no tensor '{}'", m.path, name);
  const GlobalTensor& g = it->second;
  std::vector<const Piece*> pieces;
  for (const auto& pc : g.pieces) {
    if (!pc.per_rank || pc.rank == g.pieces.front().rank) pieces.push_back(&pc);
  }
  at::Tensor out = at::zeros(g.shape, at::TensorOptions().dtype(dtype_from_code(g.dtype)));
  const int64_t covered = m.fill_box(name, g, pieces, std::vector<int64_t>(g.shape.size(), 0), g.shape, out);
  TORUS_CHECK(covered == numel_of(g.shape), ckpt::CheckpointError,
              "checkpoint: {}: the pieces of '{}' cover {} of its {} elements", m.path, name, covered,
              numel_of(g.shape));
  m.check();
  return out;
}

}  // namespace torus::ckpt
