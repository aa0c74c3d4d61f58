// An opened checkpoint (checkpoint.h): Checkpoint::open() reads the
// manifest, checked against its COMPLETE marker (Stored::read_manifest,
// stored.cpp), into the state the tensor readers use (assemble.cpp), with
// the tensors' dtypes as LibTorch's. Publishing the manifest is
// finalize() (publish.cpp).
#include "checkpoint/checkpoint_impl.h"
#include "core/log.h"

namespace torus::ckpt {

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::~Checkpoint() {
  if (impl_) impl_->drain();
}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
const std::string& Checkpoint::path() const { return impl_->path; }
const RunInfo& Checkpoint::info() const { return impl_->info; }
const std::map<std::string, Checkpoint::TensorInfo>& Checkpoint::tensors() const { return impl_->listing; }
uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& f : impl_->files) n += f.bytes;
  return n;
}

Checkpoint Checkpoint::open(const std::string& path) {
  auto m = std::make_unique<Impl>();
  m->read_manifest(path);
  for (const auto& [name, g] : m->tensors) {
    m->listing[name] = {g.shape, dtype_from_code(g.dtype), static_cast<int>(g.pieces.size())};
  }
  return Checkpoint(std::move(m));
}

}  // namespace torus::ckpt
