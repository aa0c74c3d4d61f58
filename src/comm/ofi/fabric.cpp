// libfabric endpoint setup, posting and completion reading (fabric.h).
#include "comm/ofi/fabric.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "comm/ofi/ofi_check.h"

namespace torus::comm::ofi {
namespace {

// The API version we code to; the CMake minimum of libfabric is 1.14.
constexpr uint32_t kApiVersion = FI_VERSION(1, 14);

// The mr_mode bits this code knows how to honour. FI_MR_LOCAL is offered
// only if no provider matches without it: a provider that can move host
// memory without local descriptors (EFA's RDM endpoint does) then keeps its
// own registration cache instead of one registration per op here.
constexpr int kSupportedMrMode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

// With `hmem`, FI_HMEM and FI_MR_HMEM too: device buffers are then always
// given a descriptor (OpCtx::desc), as FI_MR_HMEM asks.
InfoPtr make_hints(const FabricOptions& o, bool rma, bool mr_local, bool hmem) {
  InfoPtr hints(fi_allocinfo());
  TORUS_CHECK(hints != nullptr, CommError, "fi_allocinfo failed");
  hints->caps = FI_TAGGED | FI_MSG | (rma ? FI_RMA : 0) | (hmem ? FI_HMEM : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = kSupportedMrMode | (mr_local ? FI_MR_LOCAL : 0) | (hmem ? FI_MR_HMEM : 0);
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->control_progress = FI_PROGRESS_UNSPEC;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->tx_attr->op_flags = 0;  // completions for every operation (no selective completion)
  if (!o.provider.empty()) hints->fabric_attr->prov_name = strdup(o.provider.c_str());
  return hints;
}

bool is_avoided(const fi_info* i, const std::vector<std::string>& avoid) {
  std::string name = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
  for (const auto& a : avoid) {
    if (name == a || name.rfind(a + ";", 0) == 0) return true;
  }
  // Providers that exist for debugging or need hardware missing here never
  // win an automatic choice.
  return name == "sockets" || name.find("ofi_hook") != std::string::npos;
}

std::string mr_mode_string(uint64_t m) {
  std::vector<std::string> bits;
  if (m & FI_MR_LOCAL) bits.emplace_back("LOCAL");
  if (m & FI_MR_VIRT_ADDR) bits.emplace_back("VIRT_ADDR");
  if (m & FI_MR_ALLOCATED) bits.emplace_back("ALLOCATED");
  if (m & FI_MR_PROV_KEY) bits.emplace_back("PROV_KEY");
  if (m & FI_MR_ENDPOINT) bits.emplace_back("ENDPOINT");
  if (m & FI_MR_HMEM) bits.emplace_back("HMEM");
  return bits.empty() ? "none" : fmt::format("{}", fmt::join(bits, "|"));
}

// fi_getinfo with the hints of `o` (with or without FI_HMEM), dropping
// FI_RMA and then accepting FI_MR_LOCAL when nothing matches without.
int get_info(const FabricOptions& o, bool hmem, fi_info** list) {
  int rc = -FI_ENODATA;
  for (bool rma : {o.want_rma, false}) {
    for (bool mr_local : {false, true}) {
      InfoPtr hints = make_hints(o, rma, mr_local, hmem);
      rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), list);
      if (rc == 0) return 0;
    }
    if (!rma) break;
  }
  return rc;
}

// The providers libfabric offers for `options` (without FI_HMEM) and the one
// the Fabric takes from them. Throws CommError when none fits.
struct Choice {
  InfoPtr all;
  const fi_info* pick = nullptr;
};
Choice choose_info(const FabricOptions& options) {
  fi_info* list = nullptr;
  const int rc = get_info(options, false, &list);
  std::string asked = options.provider.empty() ? std::string("(any)") : options.provider;
  TORUS_CHECK_OFI(rc, "no libfabric provider offers RDM endpoints with FI_TAGGED|FI_MSG for provider '{}' "
                      "(check FI_PROVIDER / TORUS_OFI_PROVIDER and `fi_info -t FI_EP_RDM`)", asked);
  Choice c{InfoPtr(list), list};
  if (options.provider.empty()) {
    while (c.pick != nullptr && is_avoided(c.pick, options.avoid)) c.pick = c.pick->next;
    TORUS_CHECK(c.pick != nullptr, CommError, "libfabric offers no RDM provider other than [{}]",
                fmt::join(options.avoid, ", "));
  }
  return c;
}

}  // namespace

std::string Fabric::find_provider(const FabricOptions& options) {
  Choice c = choose_info(options);
  return c.pick->fabric_attr->prov_name ? c.pick->fabric_attr->prov_name : "?";
}

Fabric::Fabric(const FabricOptions& options) {
  Choice c = choose_info(options);
  info_.reset(fi_dupinfo(c.pick));
  TORUS_CHECK(info_ != nullptr, CommError, "fi_dupinfo failed");
  c.all.reset();
  // Device buffers: the provider and domain chosen above, asked again with
  // FI_HMEM; without it when they do not offer it (the world's choice of
  // provider never depends on HMEM).
  if (options.want_hmem && info_->fabric_attr->prov_name != nullptr) {
    FabricOptions pinned = options;
    pinned.provider = info_->fabric_attr->prov_name;
    fi_info* hmem_list = nullptr;
    if (get_info(pinned, true, &hmem_list) == 0) {
      InfoPtr hmem_all(hmem_list);
      const std::string domain = info_->domain_attr->name ? info_->domain_attr->name : "";
      for (const fi_info* i = hmem_list; i != nullptr; i = i->next) {
        if (i->domain_attr->name != nullptr && domain == i->domain_attr->name) {
          info_.reset(fi_dupinfo(i));
          TORUS_CHECK(info_ != nullptr, CommError, "fi_dupinfo failed");
          break;
        }
      }
    }
  }

  provider_ = info_->fabric_attr->prov_name ? info_->fabric_attr->prov_name : "?";
  fabric_name_ = info_->fabric_attr->name ? info_->fabric_attr->name : "?";
  domain_name_ = info_->domain_attr->name ? info_->domain_attr->name : "?";
  mr_mode_ = static_cast<uint64_t>(info_->domain_attr->mr_mode);
  has_rma_ = (info_->caps & FI_RMA) != 0;
  has_hmem_ = options.want_hmem && (info_->caps & FI_HMEM) != 0;
  needs_local_mr_ = (mr_mode_ & FI_MR_LOCAL) != 0 || options.register_local;
  max_msg_size_ = info_->ep_attr->max_msg_size ? info_->ep_attr->max_msg_size : SIZE_MAX;

  fid_fabric* fabric = nullptr;
  TORUS_CHECK_OFI(fi_fabric(info_->fabric_attr, &fabric, nullptr), "fi_fabric({})", provider_);
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  TORUS_CHECK_OFI(fi_domain(fabric_.get(), info_.get(), &domain, nullptr), "fi_domain({})", domain_name_);
  domain_.reset(domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;
  cq_attr.size = std::max<size_t>(4096, info_->tx_attr->size + info_->rx_attr->size);
  fid_cq* cq = nullptr;
  TORUS_CHECK_OFI(fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr), "fi_cq_open");
  cq_.reset(cq);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  TORUS_CHECK_OFI(fi_av_open(domain_.get(), &av_attr, &av, nullptr), "fi_av_open");
  av_.reset(av);

  // The shm provider names its region after the pid. A process killed
  // before closing its endpoint leaves the region behind, and when its pid
  // is recycled for a later process, enabling that one's endpoint fails
  // with FI_EBUSY ("shm file in use") and removes the stale region: the
  // second attempt then succeeds.
  for (int attempt = 0;; ++attempt) {
    fid_ep* ep = nullptr;
    TORUS_CHECK_OFI(fi_endpoint(domain_.get(), info_.get(), &ep, nullptr), "fi_endpoint");
    ep_.reset(ep);
    TORUS_CHECK_OFI(fi_ep_bind(ep_.get(), &av_->fid, 0), "fi_ep_bind(av)");
    TORUS_CHECK_OFI(fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    int rc = fi_enable(ep_.get());
    if (rc == -FI_EBUSY && attempt < 2) {
      TORUS_LOG_DEBUG("ofi: fi_enable({}) found a stale endpoint of a dead process; retrying", provider_);
      ep_.reset();
      continue;
    }
    TORUS_CHECK_OFI(rc, "fi_enable");
    break;
  }

  size_t len = 0;
  int name_rc = fi_getname(&ep_->fid, nullptr, &len);
  TORUS_CHECK(name_rc == -FI_ETOOSMALL || name_rc == 0, CommError, "fi_getname: {}", ofi_error_string(name_rc));
  address_.resize(len);
  TORUS_CHECK_OFI(fi_getname(&ep_->fid, address_.data(), &len), "fi_getname");
  address_.resize(len);
}

Fabric::~Fabric() = default;

void Fabric::abandon_objects() {
  (void)ep_.release();
  (void)cq_.release();
  (void)av_.release();
  (void)domain_.release();
  (void)fabric_.release();
}

void Fabric::close_endpoint() {
  InProvider in(mark_);
  ep_.reset();
  cq_.reset();
}

std::string Fabric::describe() const {
  return fmt::format(
      "provider '{}' fabric '{}' domain '{}' (mr_mode {}, rma {}, hmem {}, max message {}, address {} bytes)",
      provider_, fabric_name_, domain_name_, mr_mode_string(mr_mode_), has_rma_ ? "yes" : "no",
      has_hmem_ ? "yes" : "no", max_msg_size_, address_.size());
}

std::vector<fi_addr_t> Fabric::insert_addresses(const std::vector<std::vector<uint8_t>>& addresses) {
  std::vector<fi_addr_t> out(addresses.size(), FI_ADDR_NOTAVAIL);
  for (size_t i = 0; i < addresses.size(); ++i) {
    TORUS_CHECK(!addresses[i].empty(), InvalidArgument, "fi_av_insert: address {} is empty", i);
    int n = fi_av_insert(av_.get(), addresses[i].data(), 1, &out[i], 0, nullptr);
    TORUS_CHECK_OFI(n, "fi_av_insert of address {} ({} bytes)", i, addresses[i].size());
    TORUS_CHECK(n == 1, CommError, "fi_av_insert did not insert address {} ({} bytes)", i, addresses[i].size());
  }
  return out;
}

#define TORUS_OFI_POST(call, what)                  \
  do {                                              \
    long rc_ = (call);                              \
    if (rc_ == 0 || rc_ == -FI_EAGAIN) return rc_;  \
    TORUS_CHECK_OFI(rc_, what);                     \
    return rc_;                                     \
  } while (0)

long Fabric::tsend(const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t tag, void* context) {
  InProvider in(mark_);
  TORUS_OFI_POST(fi_tsend(ep_.get(), buf, len, desc, dest, tag, context), "fi_tsend");
}

long Fabric::trecv(void* buf, size_t len, void* desc, fi_addr_t src, uint64_t tag, uint64_t ignore, void* context) {
  InProvider in(mark_);
  TORUS_OFI_POST(fi_trecv(ep_.get(), buf, len, desc, src, tag, ignore, context), "fi_trecv");
}

long Fabric::send(const void* buf, size_t len, void* desc, fi_addr_t dest, void* context) {
  InProvider in(mark_);
  TORUS_OFI_POST(fi_send(ep_.get(), buf, len, desc, dest, context), "fi_send");
}

long Fabric::recv(void* buf, size_t len, void* desc, void* context) {
  InProvider in(mark_);
  TORUS_OFI_POST(fi_recv(ep_.get(), buf, len, desc, FI_ADDR_UNSPEC, context), "fi_recv");
}

long Fabric::write(const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t remote_addr, uint64_t key,
                   void* context) {
  TORUS_CHECK(has_rma_, Unsupported, "provider '{}' offers no FI_RMA", provider_);
  // Delivery complete: when the completion arrives the data is visible at the
  // target, so a following send can announce it.
  iovec iov{const_cast<void*>(buf), len};
  fi_rma_iov rma{remote_addr, len, key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = dest;
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = context;
  InProvider in(mark_);
  TORUS_OFI_POST(fi_writemsg(ep_.get(), &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE), "fi_writemsg");
}

#undef TORUS_OFI_POST

void Fabric::cancel(void* context) {
  InProvider in(mark_);
  (void)fi_cancel(&ep_->fid, context);
}

int Fabric::poll(fi_cq_tagged_entry* out, int max, CqError* error) {
  InProvider in(mark_);
  ssize_t n = fi_cq_read(cq_.get(), out, static_cast<size_t>(max));
  if (n > 0) return static_cast<int>(n);
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry e{};
    ssize_t r = fi_cq_readerr(cq_.get(), &e, 0);
    if (r == -FI_EAGAIN) return 0;
    TORUS_CHECK_OFI(r, "fi_cq_readerr");
    error->context = e.op_context;
    error->err = e.err < 0 ? -e.err : e.err;  // shm reports some errors negated
    const char* s = fi_cq_strerror(cq_.get(), e.prov_errno, e.err_data, nullptr, 0);
    error->message = fmt::format("{} (provider: {})", fi_strerror(e.err), s ? s : "?");
    // A message longer than the receive posted for it: in a collective, the
    // ranks disagree on its size. Said first: abort notices carry a prefix.
    if (error->err == FI_ETRUNC) error->message = "ranks passed different sizes, a message was longer: " + error->message;
    return -1;
  }
  TORUS_CHECK_OFI(n, "fi_cq_read");
  return 0;
}

MemoryRegion Fabric::register_memory(const void* buf, size_t len, uint64_t access, MemoryKind kind, int device) {
  iovec iov{const_cast<void*>(buf), len};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  attr.requested_key = (mr_mode_ & FI_MR_PROV_KEY) ? 0 : next_key_++;
  switch (kind) {
    case MemoryKind::kHost: attr.iface = FI_HMEM_SYSTEM; break;
    case MemoryKind::kCuda: attr.iface = FI_HMEM_CUDA; attr.device.cuda = device; break;
    case MemoryKind::kNeuron: attr.iface = FI_HMEM_NEURON; attr.device.neuron = device; break;
  }
  fid_mr* mr = nullptr;
  TORUS_CHECK_OFI(fi_mr_regattr(domain_.get(), &attr, 0, &mr), "fi_mr_regattr of {} bytes at {}", len, buf);
  MemoryRegion region;
  region.mr_.reset(mr);
  if (mr_mode_ & FI_MR_ENDPOINT) {
    TORUS_CHECK_OFI(fi_mr_bind(mr, &ep_->fid, 0), "fi_mr_bind");
    TORUS_CHECK_OFI(fi_mr_enable(mr), "fi_mr_enable");
  }
  region.desc_ = fi_mr_desc(mr);
  region.key_ = fi_mr_key(mr);
  region.remote_base_ = virt_addr_rma() ? reinterpret_cast<uint64_t>(buf) : 0;
  return region;
}

}  // namespace torus::comm::ofi
