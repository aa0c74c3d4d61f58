// Private: one libfabric RDM endpoint and everything it needs (fabric,
// domain, address vector, completion queue), as RAII objects.
//
// Transport contract (what the ofi backend relies on, and all that EFA
// offers — `man 7 fi_efa`):
//  * FI_EP_RDM with FI_TAGGED and FI_MSG; FI_RMA when the provider has it.
//  * Manual data progress: nothing moves unless somebody calls poll().
//  * No inject: every send completes through the CQ with its context.
//  * Ordering: only send-after-send (FI_ORDER_SAS). Tagged messages from one
//    source with one tag are matched in the order they were sent.
//  * Memory registration follows the domain's mr_mode: local descriptors only
//    when FI_MR_LOCAL asks for them (needs_local_mr()), provider or
//    requested keys (FI_MR_PROV_KEY), virtual or offset RMA addresses
//    (FI_MR_VIRT_ADDR), binding to the endpoint (FI_MR_ENDPOINT).
//  * Device buffers: with FabricOptions::want_hmem the endpoint is asked for
//    FI_HMEM (and FI_MR_HMEM); register_memory() takes the MemoryKind
//    (CUDA, Neuron) of the buffer. has_hmem() says whether it was granted.
//
// Thread safety: none. The domain is opened with FI_THREAD_DOMAIN and the
// progress engine serialises every call (Engine's driver lock).
// Destruction order: MemoryRegions must be destroyed before their Fabric.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/ofi/liveness.h"

namespace torus::comm::ofi {

// Every libfabric object is owned by a unique_ptr whose deleter closes it.
template <typename T>
struct FidCloser {
  void operator()(T* p) const noexcept {
    if (p != nullptr) fi_close(&p->fid);
  }
};
template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser<T>>;

struct InfoDeleter {
  void operator()(fi_info* p) const noexcept {
    if (p != nullptr) fi_freeinfo(p);
  }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

enum class MemoryKind : uint8_t { kHost, kCuda, kNeuron };

// A registered memory region. Movable, not copyable.
class MemoryRegion {
 public:
  MemoryRegion() = default;
  void* desc() const { return desc_; }  // for local operations (FI_MR_LOCAL)
  uint64_t key() const { return key_; }
  // The address a remote peer passes to write() to reach byte 0 of the
  // region: the virtual address under FI_MR_VIRT_ADDR, else 0 (offsets).
  uint64_t remote_base() const { return remote_base_; }
  bool valid() const { return mr_ != nullptr; }

 private:
  friend class Fabric;
  FidPtr<fid_mr> mr_;
  void* desc_ = nullptr;
  uint64_t key_ = 0;
  uint64_t remote_base_ = 0;
};

struct FabricOptions {
  std::string provider;                    // empty: the first RDM provider offered
  std::vector<std::string> avoid;          // with an empty provider: skip these (e.g. "shm" across hosts)
  bool want_rma = true;                    // ask for FI_RMA; fall back without it
  bool register_local = false;             // register local buffers even if FI_MR_LOCAL is not asked
  bool want_hmem = false;                  // ask for FI_HMEM (device buffers); fall back without it
};

// An error completion, with the provider's own explanation.
struct CqError {
  void* context = nullptr;
  int err = 0;          // positive FI_E* value
  std::string message;  // fi_cq_strerror text
};

class Fabric {
 public:
  // Opens provider, fabric, domain, CQ, AV and endpoint and enables it.
  // Throws CommError (no provider matches, or a call failed), naming the
  // provider asked for.
  explicit Fabric(const FabricOptions& options);
  // The provider a Fabric made with `options` would take, without opening
  // anything. Throws CommError like the constructor when none fits.
  static std::string find_provider(const FabricOptions& options);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  const std::string& provider() const { return provider_; }
  const std::string& fabric_name() const { return fabric_name_; }
  const std::string& domain_name() const { return domain_name_; }
  // One line for the log: provider, fabric, domain, mr_mode, caps.
  std::string describe() const;

  bool has_rma() const { return has_rma_; }
  bool has_hmem() const { return has_hmem_; }
  bool needs_local_mr() const { return needs_local_mr_; }
  bool virt_addr_rma() const { return (mr_mode_ & FI_MR_VIRT_ADDR) != 0; }
  uint64_t mr_mode() const { return mr_mode_; }
  size_t max_msg_size() const { return max_msg_size_; }

  // This endpoint's address. Its length need not be the same on every
  // process: shm's names the pid, so ranks whose pids have different
  // numbers of digits (any container's pid namespace) publish addresses of
  // different lengths. Each peer's address is therefore inserted on its own.
  const std::vector<uint8_t>& address() const { return address_; }
  size_t address_length() const { return address_.size(); }
  std::vector<fi_addr_t> insert_addresses(const std::vector<std::vector<uint8_t>>& addresses);

  // Posting. Each returns 0 when posted, -FI_EAGAIN when the provider's
  // queues are full (poll() and retry), and throws CommError on any other
  // failure. `context` must point at a fi_context2 that lives until its
  // completion (or cancellation) is read from the CQ.
  long tsend(const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t tag, void* context);
  long trecv(void* buf, size_t len, void* desc, fi_addr_t src, uint64_t tag, uint64_t ignore, void* context);
  long send(const void* buf, size_t len, void* desc, fi_addr_t dest, void* context);
  long recv(void* buf, size_t len, void* desc, void* context);
  long write(const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t remote_addr, uint64_t key,
             void* context);
  // Best effort; the cancelled operation completes with FI_ECANCELED.
  void cancel(void* context);

  // Drives progress and reads up to `max` completions into `out`. Returns
  // the number read (0: none), or -1 when the next entry is an error, which
  // is then read into *error.
  int poll(fi_cq_tagged_entry* out, int max, CqError* error);

  // Posting, cancelling and polling hold `mark` while inside the provider
  // (liveness.h, Note [Dead local peers]); null: none. Set before use.
  void set_mark(ProviderMark* mark) { mark_ = mark; }

  // Closes the endpoint and its CQ, which ends every transfer: only after
  // this may memory that pending operations point at (scratch, registered
  // regions) be freed. Memory regions stay valid until the Fabric is
  // destroyed. Nothing may be posted or polled afterwards. Idempotent.
  void close_endpoint();
  // Leaves every libfabric object open for good (Note [Teardown after a
  // hard failure], engine.h): nothing is closed, now or at destruction.
  // Nothing may be posted or polled afterwards.
  void abandon_objects();

  // Registers [buf, buf+len) for `access` (FI_SEND|FI_RECV|FI_WRITE|
  // FI_REMOTE_WRITE...). Throws CommError.
  MemoryRegion register_memory(const void* buf, size_t len, uint64_t access, MemoryKind kind = MemoryKind::kHost,
                               int device = 0);

 private:
  InfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_av> av_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_ep> ep_;
  std::string provider_, fabric_name_, domain_name_;
  std::vector<uint8_t> address_;
  uint64_t mr_mode_ = 0;
  bool has_rma_ = false;
  bool has_hmem_ = false;
  bool needs_local_mr_ = false;
  size_t max_msg_size_ = 0;
  uint64_t next_key_ = 1;
  ProviderMark* mark_ = nullptr;
};

}  // namespace torus::comm::ofi
